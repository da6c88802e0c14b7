package hooks

import (
	"slices"
	"sync"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/frame"
)

// pubDelivery is one publish on its way to its subscribers: the frames encoded
// so far, one per variant.
type pubDelivery struct {
	h        *Fanout
	pk       packets.Packet
	deadline int64  // unix seconds after which a queued QoS 1/2 copy is dropped unsent; 0: never
	ref      uint64 // the backend's reference of the message (FanoutConfig.Refs), kept with outbox copies
	// retained: a retained message sent on SUBSCRIBE, whose RETAIN flag
	// stays set whatever the subscription says [MQTT-3.3.1-9].
	retained bool
	variants []variant
	// stores is set when the publisher waits for an acknowledgement that
	// must mean stored: the writes of the persistent sessions' records.
	stores *storeWait
	// round holds the subscribers' writers while the publisher's read is
	// being fed (connq.Round); nil: each starts as its frame is queued.
	round *connq.Round
}

// storeWait gathers the record writes of one publish's deliveries to
// persistent sessions: its publisher is acknowledged once they are all
// durable, or refused if one failed (a full disk), never told a message is
// accepted that a session did not store.
type storeWait struct {
	mu      sync.Mutex
	pending int
	writes  int // writes started (the caller's goroutine only)
	err     error
	fire    func(error) // set by seal
}

// add counts one more write; done hears its outcome.
func (w *storeWait) add() {
	w.mu.Lock()
	w.pending++
	w.mu.Unlock()
}

func (w *storeWait) done(err error) {
	w.mu.Lock()
	w.pending--
	if err != nil && w.err == nil {
		w.err = err
	}
	fire, werr := w.fire, w.err
	if w.pending > 0 || fire == nil {
		fire = nil
	}
	w.mu.Unlock()
	if fire != nil {
		fire(werr)
	}
}

// seal says no write will be added: fire runs once every write finished
// (at once if they have), with the first failure.
func (w *storeWait) seal(fire func(error)) {
	w.add()
	w.mu.Lock()
	w.fire = fire
	w.mu.Unlock()
	w.done(nil)
}

type variant struct {
	version byte
	qos     byte
	retain  bool
	ids     []int
	pub     *frame.Publish
}

func (h *Fanout) newDelivery(pk packets.Packet) *pubDelivery {
	d := &pubDelivery{h: h, pk: pk, deadline: pk.Expiry}
	if d.deadline <= 0 {
		// max-message-expiry also bounds how long messages without an expiry
		// interval wait in a session.
		if max := h.server.Options.Capabilities.MaximumMessageExpiryInterval; max > 0 {
			d.deadline = pk.Created + max
		}
	}
	return d
}

// newPublishDelivery is a publish on its way to its subscribers, with the
// backend's reference of it (Refs).
func (h *Fanout) newPublishDelivery(pk packets.Packet) *pubDelivery {
	d := h.newDelivery(pk)
	if h.refs != nil && pk.FixedHeader.Qos > 0 {
		d.ref = h.refs(pk)
	}
	return d
}

// newRetainedDelivery is a retained message sent on SUBSCRIBE: it has no
// backend reference (it is not a message queued for the session).
func (h *Fanout) newRetainedDelivery(pk packets.Packet) *pubDelivery {
	d := h.newDelivery(pk)
	d.retained = true
	return d
}

// to delivers the publish to one subscriber, applying no-local,
// retain-as-published, the granted QoS and the client's maximum packet
// size: QoS 0 to the live connection (a session that is away gets none, as
// in mochi), QoS 1/2 to the session's outbox.
func (d *pubDelivery) to(rt route) {
	s, pk, h := rt.s, &d.pk, d.h
	if rt.noLocal && pk.Origin == s.id {
		return // [MQTT-3.8.3-3]
	}
	qos := min(pk.FixedHeader.Qos, rt.qos)
	c := s.cur.Load()
	version, maxPacket := byte(s.version.Load()), uint32(0)
	if c != nil {
		version, maxPacket = c.version, c.maxPacket
	}
	if qos == 0 && c == nil {
		return
	}
	if c != nil {
		d.round.Hold(c.q)
	}
	version = wireVersion(version)
	retain := pk.FixedHeader.Retain && (d.retained || (version == 5 && rt.retainAsPublished)) // [MQTT-3.3.1-9] [MQTT-3.3.1-12]
	p := d.frame(version, qos, retain, rt.ids)
	switch {
	case p == nil:
	case !fits(maxPacket, len(p.B)):
		h.Stats.TooLarge.Add(1)
	case qos == 0:
		if c.q.Enqueue(p) {
			h.Stats.Deliveries.Add(1)
		}
	default:
		var stored func(error)
		if w := d.stores; w != nil {
			w.add()
			stored = w.done
		}
		added, pending := s.need(h.sessions.cfg).AddDurable(p, pk.Created, d.deadline, d.ref, stored)
		switch {
		case stored != nil && !pending:
			stored(nil) // a session that is not persisted: nothing to wait for
		case pending:
			d.stores.writes++
		}
		if added {
			h.Stats.Tracked.Add(1)
		}
	}
}

// frame returns the encoded PUBLISH for one variant, encoding it on first use.
func (d *pubDelivery) frame(version, qos byte, retain bool, ids []int) *frame.Publish {
	for _, v := range d.variants {
		if v.version == version && v.qos == qos && v.retain == retain && slices.Equal(v.ids, ids) {
			return v.pub
		}
	}
	p, err := encodeFrame(d.pk, version, retain, qos, ids)
	if err != nil {
		d.h.Log.Error("fanout: encode publish", "topic", clip(d.pk.TopicName), "error", err)
		return nil
	}
	d.h.Stats.Encodes.Add(1)
	d.variants = append(d.variants, variant{version: version, qos: qos, retain: retain, ids: ids, pub: p})
	return p
}
