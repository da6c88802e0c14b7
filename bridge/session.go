package bridge

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
	"github.com/keyline-mq/keyline/keyshared"
)

// session is one connection's worth of bridge state: the publishes in
// flight under their packet ids, and the inbound worker. A new connection
// gets a new session, so a late call for an old one touches nothing live.
type session struct {
	b      *Bridge
	c      *conn
	window int // publishes in flight at most: MaxInflight, lowered to the remote's Receive Maximum

	mu struct {
		sync.Mutex
		infl   map[uint16]*pending
		nextID uint16
	}
	inbound chan inbound // to the inbound worker; closed when the reader ends
	wg      sync.WaitGroup
}

// pending is one packet id in use.
type pending struct {
	kind   uint8 // what answer the id awaits
	o      *outRule
	member string
	offset uint64
	logged bool // the message is in a group log (it must be acked there)
	sent   time.Time
}

const (
	awaitPuback uint8 = iota + 1
	awaitPubrec
	awaitPubcomp
	awaitRelease // a QoS 2 id of the last connection, released with PUBREL
	awaitSuback
)

// connect dials the remote and sets up a session on the connection.
func (b *Bridge) connect(ctx context.Context) (*session, error) {
	private := b.cfg.Protocol == MQTT311 && b.cfg.TryPrivate && !b.noPrivate.Load()
	c, err := dial(ctx, &b.cfg, b.maxPacket, private)
	if err != nil {
		return nil, err
	}
	if private && !c.private {
		b.noPrivate.Store(true) // not asked again until the broker restarts
		b.log.Info("bridge: the remote refuses try_private's mark; connecting without it")
	}
	s := &session{b: b, c: c, window: min(b.cfg.MaxInflight, c.ack.receiveMax), inbound: make(chan inbound, b.cfg.InboundMax)}
	s.mu.infl = map[uint16]*pending{}
	return s, nil
}

// attach starts the session: releases what the last one left in a kept
// session, subscribes to the inbound rules and makes the bridge a member of
// its outbound groups (deliveries start).
func (b *Bridge) attach(s *session) {
	b.mu.Lock()
	if !s.c.ack.sessionPresent {
		clear(b.mu.pendingRel)
		clear(b.mu.inQoS2)
	}
	rel := make([]uint16, 0, len(b.mu.pendingRel))
	for id := range b.mu.pendingRel {
		rel = append(rel, id)
	}
	clear(b.mu.pendingRel)
	b.mu.Unlock()
	s.mu.Lock()
	for _, id := range rel {
		s.mu.infl[id] = &pending{kind: awaitRelease, sent: time.Now()}
	}
	s.mu.Unlock()
	s.c.start(s.handle)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.inboundLoop()
	}()
	for _, id := range rel {
		_ = s.c.send(mqttwire.AppendAck(nil, mqttwire.TypePubrel, id, 0))
	}
	if len(b.ins) > 0 {
		s.subscribe()
	} else {
		b.mu.Lock()
		b.mu.subscribed = true
		b.mu.Unlock()
	}
	b.cur.Store(s)
	limit := max(1, s.window/max(1, len(b.outs)))
	for _, o := range b.outs {
		if err := o.group.AddMember(b.member, limit); err != nil {
			b.log.Error("bridge: cannot join an outbound group; its messages wait", "group", o.group.Name(), "error", err)
		}
	}
}

// detach ends the session after its connection closed: the bridge leaves
// its outbound groups, which requeues every message in flight at the head
// of its key (a lost connection is not a failed attempt: the groups' retry
// limit is the bridge's max-deliveries, counted on the remote's refusals).
func (b *Bridge) detach(s *session) {
	b.cur.CompareAndSwap(s, nil)
	s.c.wait()
	close(s.inbound)
	s.wg.Wait()
	for _, o := range b.outs {
		if err := o.group.RemoveMember(b.member); err != nil {
			b.log.Warn("bridge: leaving an outbound group", "group", o.group.Name(), "error", err)
		}
	}
	if b.cfg.CleanStart {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	for id, p := range s.mu.infl {
		if p.kind == awaitPubrec || p.kind == awaitPubcomp || p.kind == awaitRelease {
			b.mu.pendingRel[id] = true
		}
	}
}

// tickEvery is the period of the session's checks: keep-alive and
// acknowledgement timeouts.
func (s *session) tickEvery() time.Duration {
	d := s.b.cfg.AckTimeout / 4
	if ka := s.c.ack.keepAlive; ka > 0 {
		d = min(d, ka/4)
	}
	return min(max(d, 10*time.Millisecond), time.Second)
}

// check sends a PINGREQ when the connection was quiet for a keep-alive
// interval, and says why the connection is dead when the remote sent
// nothing for 1.5 intervals or left a publish unacknowledged past AckTimeout.
func (s *session) check(now time.Time) error {
	recv, sent := s.c.idle(now)
	if ka := s.c.ack.keepAlive; ka > 0 {
		if recv > ka*3/2 {
			return fmt.Errorf("bridge: nothing from the remote for %v (keep-alive %v)", recv.Round(time.Millisecond), ka)
		}
		if sent >= ka || recv >= ka {
			_ = s.c.send(mqttwire.AppendPingreq(nil))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, p := range s.mu.infl {
		if now.Sub(p.sent) > s.b.cfg.AckTimeout {
			return fmt.Errorf("bridge: packet %d unacknowledged for %v (ack-timeout)", id, now.Sub(p.sent).Round(time.Millisecond))
		}
	}
	return nil
}

func (s *session) inflight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.mu.infl)
}

// allocLocked takes a free packet id; false when the window is full.
func (s *session) allocLocked(p *pending, limit int) (uint16, bool) {
	if len(s.mu.infl) >= limit {
		return 0, false
	}
	for {
		s.mu.nextID++
		if s.mu.nextID == 0 {
			s.mu.nextID = 1
		}
		if _, used := s.mu.infl[s.mu.nextID]; !used {
			s.mu.infl[s.mu.nextID] = p
			return s.mu.nextID, true
		}
	}
}

// publish sends m of rule o to the remote. It never blocks: false means
// the bridge cannot take it now (no room in the window, the connection
// closing) and the dispatcher offers it again later.
func (s *session) publish(o *outRule, member string, m *keyshared.Message) bool {
	b := s.b
	logged := m.QoS > 0
	if looped(m, b.brokerID, false) {
		b.st.looped.Add(1)
		if logged {
			o.group.Ack(member, m.Offset)
		}
		return true
	}
	qos := min(m.QoS, o.rule.QoS, s.c.ack.maxQoS)
	p := mqttwire.Publish{Topic: o.rule.ToRemote(m.Topic), QoS: qos, Payload: m.Payload}
	if s.c.version == MQTT5 {
		p.Props = outProps(m, b.brokerID)
	}
	if n := mqttwire.PublishLen(s.c.version, &p); s.c.ack.maxPacket > 0 && n > int(s.c.ack.maxPacket) {
		b.log.Warn("bridge: a message is larger than the remote's maximum packet size; dead-lettered", "topic", m.Topic, "bytes", n, "max", s.c.ack.maxPacket)
		if logged {
			o.group.Reject(member, m.Offset, 0x95)
		} else {
			b.st.dropped.Add(1)
		}
		return true
	}
	if qos == 0 {
		if s.c.send(mqttwire.AppendPublish(nil, s.c.version, &p)) != nil {
			return false
		}
		b.st.sent.Add(1)
		if logged {
			o.group.Ack(member, m.Offset) // written is done: the rule forwards at QoS 0
		}
		return true
	}
	pe := &pending{kind: awaitPuback, o: o, member: member, offset: m.Offset, logged: true, sent: time.Now()}
	if qos == 2 {
		pe.kind = awaitPubrec
	}
	s.mu.Lock()
	id, ok := s.allocLocked(pe, s.window)
	s.mu.Unlock()
	if !ok {
		return false
	}
	p.PacketID = id
	if s.c.send(mqttwire.AppendPublish(nil, s.c.version, &p)) != nil {
		s.release(id)
		return false
	}
	return true
}

// release frees a packet id and returns what it carried.
func (s *session) release(id uint16) *pending {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.mu.infl[id]
	delete(s.mu.infl, id)
	return p
}

// forgetOffset frees the id carrying offset of o (a revoked delivery).
func (s *session) forgetOffset(o *outRule, offset uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, p := range s.mu.infl {
		if p.o == o && p.offset == offset {
			delete(s.mu.infl, id)
			return
		}
	}
}

// looped reports whether m already left the broker brokerID through a
// bridge, or (entered too) was brought into it by one.
func looped(m *keyshared.Message, brokerID string, entered bool) bool {
	for _, u := range m.Props.User {
		if u.Val == brokerID && (u.Key == ViaProperty || (entered && u.Key == InProperty)) {
			return true
		}
	}
	return false
}

// outProps are the MQTT 5 properties of m as it goes out, with this
// broker's via mark.
func outProps(m *keyshared.Message, brokerID string) mqttwire.Properties {
	p := mqttwire.Properties{
		ContentType: m.Props.ContentType, ResponseTopic: m.Props.ResponseTopic, CorrelationData: m.Props.CorrelationData,
	}
	if m.Props.PayloadFormatSet {
		p.PayloadFormat = m.Props.PayloadFormat
	}
	if !m.ExpiresAt.IsZero() {
		p.MessageExpiry = uint32(max(time.Until(m.ExpiresAt)/time.Second, 1))
	}
	p.User = make([]mqttwire.UserProperty, 0, len(m.Props.User)+1)
	for _, u := range m.Props.User {
		p.User = append(p.User, mqttwire.UserProperty{Key: u.Key, Value: u.Val})
	}
	p.User = append(p.User, mqttwire.UserProperty{Key: ViaProperty, Value: brokerID})
	return p
}

// handle takes one packet from the remote (reader goroutine).
func (s *session) handle(p mqttwire.Packet) error {
	v := s.c.version
	switch p.Type {
	case mqttwire.TypePuback, mqttwire.TypePubrec, mqttwire.TypePubcomp:
		a, err := mqttwire.DecodeAck(v, p)
		if err != nil {
			return err
		}
		s.answered(p.Type, a)
	case mqttwire.TypePublish:
		return s.received(p)
	case mqttwire.TypePubrel:
		a, err := mqttwire.DecodeAck(v, p)
		if err != nil {
			return err
		}
		s.b.mu.Lock()
		delete(s.b.mu.inQoS2, a.PacketID)
		s.b.mu.Unlock()
		return s.c.send(mqttwire.AppendAck(nil, mqttwire.TypePubcomp, a.PacketID, 0))
	case mqttwire.TypeSuback:
		sa, err := mqttwire.DecodeSuback(v, p)
		if err != nil {
			return err
		}
		s.release(sa.PacketID)
		s.b.mu.Lock()
		s.b.mu.subscribed = true
		s.b.mu.Unlock()
		for i, code := range sa.ReasonCodes {
			if code >= 0x80 && i < len(s.b.ins) {
				err := fmt.Errorf("bridge: the remote refused the subscription %q: %s", s.b.ins[i].RemoteFilter(), reasonName(code))
				s.b.setError(err)
				s.b.log.Error(err.Error())
			}
		}
	case mqttwire.TypePingresp, mqttwire.TypeUnsuback:
	case mqttwire.TypeDisconnect:
		d, err := mqttwire.DecodeDisconnect(v, p)
		if err != nil {
			return err
		}
		return fmt.Errorf("bridge: the remote disconnected: %s", reasonName(d.ReasonCode))
	default:
		return fmt.Errorf("bridge: unexpected %s from the remote", mqttwire.TypeName(p.Type))
	}
	return nil
}

// answered handles the remote's PUBACK, PUBREC or PUBCOMP of a publish.
func (s *session) answered(typ byte, a mqttwire.Ack) {
	s.mu.Lock()
	p := s.mu.infl[a.PacketID]
	want := awaitPuback
	switch typ {
	case mqttwire.TypePubrec:
		want = awaitPubrec
	case mqttwire.TypePubcomp:
		want = awaitPubcomp
	}
	switch {
	case p == nil:
		s.mu.Unlock()
		return // late or unknown: the delivery was revoked, or a release answered
	case p.kind == awaitRelease && typ == mqttwire.TypePubcomp:
		delete(s.mu.infl, a.PacketID)
		s.mu.Unlock()
		return
	case p.kind != want:
		s.mu.Unlock()
		return
	case typ == mqttwire.TypePubrec && a.ReasonCode < 0x80:
		p.kind = awaitPubcomp
		s.mu.Unlock()
		_ = s.c.send(mqttwire.AppendAck(nil, mqttwire.TypePubrel, a.PacketID, 0))
		return
	}
	delete(s.mu.infl, a.PacketID)
	s.mu.Unlock()
	b := s.b
	switch {
	case a.ReasonCode < 0x80:
		b.st.sent.Add(1)
		p.o.group.Ack(p.member, p.offset)
	case permanent(a.ReasonCode):
		b.st.nacked.Add(1)
		b.log.Warn("bridge: the remote refused a message for good; dead-lettered", "group", p.o.group.Name(), "offset", p.offset, "reason", reasonName(a.ReasonCode))
		p.o.group.Reject(p.member, p.offset, a.ReasonCode)
	default:
		b.st.nacked.Add(1)
		p.o.group.Nack(p.member, p.offset, a.ReasonCode)
	}
}

// subscribe sends one SUBSCRIBE for the inbound rules: No Local (MQTT 5) so
// the remote does not send back what the bridge published, Retain As
// Published so retained messages stay retained.
func (s *session) subscribe() {
	sub := mqttwire.Subscribe{}
	for _, r := range s.b.ins {
		opts := r.QoS
		if s.c.version == MQTT5 {
			opts |= 0x04 | 0x08
		}
		sub.Filters = append(sub.Filters, mqttwire.Subscription{Filter: r.RemoteFilter(), Options: opts})
	}
	s.mu.Lock()
	id, ok := s.allocLocked(&pending{kind: awaitSuback, sent: time.Now()}, 65535)
	s.mu.Unlock()
	if !ok {
		s.c.close(errors.New("bridge: no packet id free for SUBSCRIBE"))
		return
	}
	sub.PacketID = id
	_ = s.c.send(mqttwire.AppendSubscribe(nil, s.c.version, &sub))
}
