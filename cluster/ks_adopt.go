package cluster

import (
	"sync"

	"github.com/keyline-mq/keyline/keyshared"
)

// adoptions carry what a new holder learns at takeover from the nodes'
// resyncs, so that it redelivers only what was not acknowledged:
//
//   - a delivery a member still holds (outstanding) is adopted: when the
//     dispatcher delivers that message, it is not sent again; the member's
//     ack, which names the member that holds it, is handed to the dispatcher
//     for the member the dispatcher chose (the same one unless the ring
//     changed meanwhile);
//   - the key of an adopted delivery had every earlier message resolved
//     (only the head of a key is ever delivered), even if the old holder's
//     last state write did not say so: those are resolved when read;
//   - an ack made under the old holder and not yet known durable is
//     applied as the message is read (or, already read, at its delivery).
//
// Safe for concurrent use: the dispatcher's goroutine asks through the log
// and the deliverer, the holder's request handler adds and acks.
type adoptions struct {
	mu       sync.Mutex
	byOffset map[uint64]*adoption
	byKey    map[string]uint64 // key -> highest outstanding offset adopted
}

type adoption struct {
	member     string // who holds it (outstanding), or who acked it
	key        string
	acked      bool   // acknowledged: resolve on read or at delivery
	delivered  bool   // the dispatcher delivered it (to coreMember) without sending
	coreMember string // the member the dispatcher thinks holds it
}

func newAdoptions() *adoptions {
	return &adoptions{byOffset: map[uint64]*adoption{}, byKey: map[string]uint64{}}
}

// outstanding adopts a delivery of offset (key) that member holds.
func (a *adoptions) outstanding(member string, offset uint64, key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.byKey[key]; ok && cur > offset {
		return // a later message of the key is out: this one was resolved since
	}
	if cur, ok := a.byKey[key]; ok && cur < offset {
		delete(a.byOffset, cur)
	}
	a.byKey[key] = offset
	a.byOffset[offset] = &adoption{member: member, key: key}
}

// ackedEarly records an ack made under an earlier holder.
func (a *adoptions) ackedEarly(member string, offset uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ad := a.byOffset[offset]; ad != nil {
		ad.acked = true
		return
	}
	a.byOffset[offset] = &adoption{member: member, acked: true}
}

// resolvedByTakeover reports whether m, just read, is resolved by what the
// resync said: acked, or older than its key's adopted delivery.
func (a *adoptions) resolvedByTakeover(m *keyshared.Message) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.byOffset) == 0 {
		return false
	}
	if ad := a.byOffset[m.Offset]; ad != nil && ad.acked && !ad.delivered {
		a.forgetLocked(m.Offset, ad)
		return true
	}
	if off, ok := a.byKey[m.Key]; ok && m.Offset < off {
		return true
	}
	return false
}

// intercept is asked before a delivery: adopted reports that the message
// is with a member already (nothing to send); ack, that it was acknowledged
// meanwhile (the caller acks it for member).
func (a *adoptions) intercept(member string, offset uint64) (adopted, ack bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ad := a.byOffset[offset]
	if ad == nil || ad.delivered {
		return false, false
	}
	if ad.acked {
		a.forgetLocked(offset, ad)
		return true, true
	}
	ad.delivered, ad.coreMember = true, member
	return true, false
}

// answer maps a member's answer about offset to the member the dispatcher
// thinks holds it. ok is false when the answer is for an adopted message
// not delivered yet: it is recorded (an ack) and must not reach the
// dispatcher.
func (a *adoptions) answer(member string, offset uint64, isAck bool) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ad := a.byOffset[offset]
	if ad == nil || ad.member != member {
		return member, true
	}
	if !ad.delivered {
		if isAck {
			ad.acked = true
		} else {
			a.forgetLocked(offset, ad) // a nack before delivery: deliver it normally
		}
		return "", false
	}
	a.forgetLocked(offset, ad)
	return ad.coreMember, true
}

// revoked forgets an adopted delivery the dispatcher gave up on.
func (a *adoptions) revoked(offset uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ad := a.byOffset[offset]; ad != nil && ad.delivered {
		a.forgetLocked(offset, ad)
	}
}

// pruneThrough forgets adoptions at or below offset (all read and settled).
func (a *adoptions) pruneThrough(offset uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for off, ad := range a.byOffset {
		if off <= offset && !ad.delivered {
			a.forgetLocked(off, ad)
		}
	}
}

func (a *adoptions) forgetLocked(offset uint64, ad *adoption) {
	delete(a.byOffset, offset)
	if ad.key != "" && a.byKey[ad.key] == offset {
		delete(a.byKey, ad.key)
	}
}
