package mqtt

import (
	"errors"
	"sync"

	"github.com/mochi-mqtt/server/v2/packets"
)

// Keyline's fork (PATCHES.md item 21): a deferred publish.

// ErrPublishDeferred is what a *DeferredPublish answers errors.Is with.
var ErrPublishDeferred = errors.New("publish deferred")

// DeferredPublish lets a hook take the rest of a publish off the client's
// reading goroutine: the hook's OnPublish returns (pk, d) for d from
// DeferPublish, and mochi goes on reading the client's next packets. The
// hook calls d.Resume once, from any goroutine, when what it waited for
// (a store) has answered; then the hooks after it run, and the rest of the
// publish (the acknowledgement, mochi's routing, OnPublished) on the
// goroutine that calls Resume, or on the reading goroutine if Resume came
// first. A hook that defers several publishes of one client resumes them
// in the order it deferred them: that keeps their acknowledgements and
// deliveries in the client's order.
type DeferredPublish struct {
	mu      sync.Mutex
	s       *Server
	cl      *Client
	pk      packets.Packet // as processPublish had it before the hooks
	pkx     packets.Packet // as the deferring hook returned it
	after   []Hook         // the OnPublish hooks after the one that deferred
	started bool
	resumed bool
	err     error
}

// DeferPublish returns a handle for a hook's OnPublish to return as its
// error, deferring the rest of the publish until its Resume.
func DeferPublish() *DeferredPublish { return new(DeferredPublish) }

// Error makes a *DeferredPublish an error (OnPublish's answer).
func (d *DeferredPublish) Error() string { return ErrPublishDeferred.Error() }

// Is reports whether target is ErrPublishDeferred.
func (d *DeferredPublish) Is(target error) bool { return target == ErrPublishDeferred }

// Resume goes on with the publish: err nil runs the hooks after the one
// that deferred it; err non-nil is taken as that hook's answer (a
// packets.Code refuses a QoS 1/2 publish of an MQTT 5 client with it;
// packets.ErrRejectPacket drops it without an acknowledgement). Only the
// first call counts. It reports whether the rest of the publish ran in
// this call: false when OnPublish has not returned d yet (the rest then
// runs on the client's reader once it has) or for a call that did not count.
func (d *DeferredPublish) Resume(err error) bool {
	d.mu.Lock()
	if d.resumed {
		d.mu.Unlock()
		return false
	}
	d.resumed, d.err = true, err
	run := d.started
	d.mu.Unlock()
	if run {
		d.finish()
	}
	return run
}

// start is processPublish's part: the hooks have returned d.
func (d *DeferredPublish) start(s *Server, cl *Client, pk packets.Packet) {
	d.mu.Lock()
	d.s, d.cl, d.pk, d.started = s, cl, pk, true
	run := d.resumed
	d.mu.Unlock()
	if run {
		d.finish()
	}
}

// finish runs the rest of the publish, once both start and Resume ran.
func (d *DeferredPublish) finish() {
	s, cl := d.s, d.cl
	pkx, err := d.pkx, d.err
	if err == nil {
		pkx, err = s.hooks.onPublishFrom(d.after, cl, pkx)
		if next := deferredOf(err); next != nil { // a later hook defers it too
			next.start(s, cl, d.pk)
			return
		}
	}
	if err := s.publishAfterHooks(cl, d.pk, pkx, err); err != nil {
		// What receivePacket does with a publish that failed.
		if code, ok := err.(packets.Code); ok && cl.Properties.ProtocolVersion == 5 && code.Code >= packets.ErrUnspecifiedError.Code {
			_ = s.DisconnectClient(cl, code)
		}
		cl.Stop(err)
	}
}

// deferredOf returns the deferred publish err is, if it is one.
func deferredOf(err error) *DeferredPublish {
	if err == nil {
		return nil
	}
	var d *DeferredPublish
	if errors.As(err, &d) {
		return d
	}
	return nil
}
