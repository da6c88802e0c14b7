package bridge

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/keyline-mq/keyline/internal/filter"
	"github.com/keyline-mq/keyline/internal/mqttwire"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// inbound is a message from the remote, copied out of its packet.
type inbound struct {
	m      keyshared.Message
	retain bool
	qos    byte   // the packet's QoS, which the acknowledgement follows
	id     uint16 // packet id (QoS 1, 2)
	dup    bool   // a QoS 2 publish already taken in: acknowledge again only
	drop   bool   // not to be taken in (looped, no rule): acknowledge only
}

// received takes a PUBLISH from the remote (reader goroutine): it maps the
// topic by the first inbound rule that matches, copies the message and
// queues it for the inbound worker, which publishes it here and then
// acknowledges it. The queue holds the bridge's Receive Maximum; past that
// (only QoS 0 can get there) the reader waits, and TCP slows the remote.
func (s *session) received(p mqttwire.Packet) error {
	v := s.c.version
	pv, err := mqttwire.DecodePublish(v, p)
	if err != nil {
		return err
	}
	in := inbound{retain: pv.Retain, qos: pv.QoS, id: pv.PacketID}
	in.m.QoS = pv.QoS
	topic := string(pv.Topic)
	var local string
	ok := false
	for _, r := range s.b.ins {
		if filter.Match(r.RemoteFilter(), topic) {
			if local, ok = r.ToLocal(topic); ok {
				in.m.QoS = min(in.m.QoS, r.QoS)
				break
			}
		}
	}
	if ok && !localTopicOK(local) {
		ok = false // a remote does not publish into $SYS/, $dlq/, ... here
		s.b.log.Warn("bridge: dropped a message from the remote for a local topic the bridge may not publish", "topic", clipTopic(local))
	}
	if !ok {
		in.drop = true
		s.b.st.dropped.Add(1) // nothing subscribed asks for it, or it may not go where it maps
	} else {
		in.m.Topic = local
		in.m.Payload = append([]byte(nil), pv.Payload...)
		if v == MQTT5 {
			if err := inProps(&in.m, pv.Props); err != nil {
				return err
			}
		}
		if looped(&in.m, s.b.brokerID, true) {
			in.drop = true
			s.b.st.looped.Add(1)
		}
		in.m.Props.User = append(in.m.Props.User, keyshared.UserProperty{Key: InProperty, Val: s.b.brokerID})
	}
	if pv.QoS == 2 {
		s.b.mu.Lock()
		in.dup = s.b.mu.inQoS2[pv.PacketID]
		s.b.mu.Unlock()
	}
	select {
	case s.inbound <- in:
		return nil
	case <-s.c.done:
		return s.c.err
	}
}

// localTopicOK reports whether a bridge may publish on topic here: a valid
// topic name (the broker's own client skips that check) that does not start
// with '$' (the broker's own topics: $SYS/, $dlq/, $share/, ...).
func localTopicOK(topic string) bool {
	return topic != "" && len(topic) <= mqttwire.MaxString && topic[0] != '$' &&
		!strings.ContainsAny(topic, "+#\x00") && utf8.ValidString(topic)
}

func clipTopic(s string) string {
	if len(s) > 128 {
		return s[:128] + "..."
	}
	return s
}

// inProps copies the MQTT 5 properties of a received publish into m.
func inProps(m *keyshared.Message, raw mqttwire.RawProperties) error {
	props, err := raw.Parse()
	if err != nil {
		return err
	}
	m.Props.ContentType = props.ContentType
	m.Props.ResponseTopic = props.ResponseTopic
	if len(props.CorrelationData) > 0 {
		m.Props.CorrelationData = append([]byte(nil), props.CorrelationData...)
	}
	if props.PayloadFormat != 0 {
		m.Props.PayloadFormat, m.Props.PayloadFormatSet = props.PayloadFormat, true
	}
	if props.HasMessageExpiry {
		m.ExpiresAt = time.Now().Add(time.Duration(props.MessageExpiry) * time.Second)
	}
	for _, u := range props.User {
		m.Props.User = append(m.Props.User, keyshared.UserProperty{Key: u.Key, Val: u.Value})
	}
	return nil
}

// inboundLoop publishes what the remote sends, in order, and acknowledges
// each once it is published here (durable, for QoS 1/2 messages that go to
// groups). A refusal the remote can retry (a full backlog, a store error)
// closes the connection without acknowledging: a remote that keeps the
// session sends the message again on the next one. A refusal that cannot
// change (a routing key too long) is acknowledged with 0x99 (MQTT 5) and counted.
func (s *session) inboundLoop() {
	for in := range s.inbound {
		select {
		case <-s.c.done:
			continue // not acknowledged: the remote sends it again
		default:
		}
		var reason byte
		if !in.drop && !in.dup {
			err := s.b.inj.Publish(&in.m, in.retain)
			switch {
			case err == nil:
				s.b.st.received.Add(1)
			case errors.Is(err, ErrRefused):
				s.b.st.dropped.Add(1)
				s.b.log.Warn("bridge: a message from the remote cannot be taken here; dropped", "topic", in.m.Topic, "error", err)
				reason = 0x99
			case in.qos == 0:
				s.b.st.dropped.Add(1)
				continue
			default:
				s.b.st.refused.Add(1)
				code := byte(0x80)
				if errors.Is(err, persistence.ErrBacklogFull) {
					code = 0x97
				}
				s.b.log.Warn("bridge: a message from the remote was refused here; disconnecting so that it comes again", "topic", in.m.Topic, "error", err)
				s.c.disconnect(code, fmt.Errorf("bridge: a message from the remote was refused here: %w", err))
				continue
			}
		}
		switch in.qos {
		case 1:
			_ = s.c.send(mqttwire.AppendAck(nil, mqttwire.TypePuback, in.id, s.reasonFor(reason)))
		case 2:
			if reason == 0 {
				s.b.mu.Lock()
				s.b.mu.inQoS2[in.id] = true
				s.b.mu.Unlock()
			}
			_ = s.c.send(mqttwire.AppendAck(nil, mqttwire.TypePubrec, in.id, s.reasonFor(reason)))
		}
	}
}

// reasonFor is an acknowledgement's reason code as the protocol allows it
// (3.1.1 has none).
func (s *session) reasonFor(code byte) byte {
	if s.c.version == MQTT311 {
		return 0
	}
	return code
}
