package mqtt

import (
	"io"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mochi-mqtt/server/v2/packets"
)

// deferHook defers every QoS 1/2 publish (PATCHES.md item 21); the test
// resumes them.
type deferHook struct {
	HookBase
	mu       sync.Mutex
	deferred []*DeferredPublish
}

func (h *deferHook) ID() string { return "defer" }

func (h *deferHook) Provides(b byte) bool { return b == OnPublish }

func (h *deferHook) OnPublish(_ *Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Qos == 0 {
		return pk, nil
	}
	d := DeferPublish()
	h.mu.Lock()
	h.deferred = append(h.deferred, d)
	h.mu.Unlock()
	pk.Payload = append([]byte("deferred:"), pk.Payload...) // what the deferring hook returned goes on
	return pk, d
}

// afterHook records the publishes the hooks after the deferring one see.
type afterHook struct {
	HookBase
	mu   sync.Mutex
	seen []string
}

func (h *afterHook) ID() string { return "after" }

func (h *afterHook) Provides(b byte) bool { return b == OnPublish }

func (h *afterHook) OnPublish(_ *Client, pk packets.Packet) (packets.Packet, error) {
	h.mu.Lock()
	h.seen = append(h.seen, string(pk.Payload))
	h.mu.Unlock()
	return pk, nil
}

func (h *afterHook) got() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}

// A hook that defers a publish takes its rest off the reading goroutine: the
// publisher's next packets are processed, nothing after the hook runs and
// no acknowledgement goes out until Resume, and then the acknowledgements
// go in the order of the Resumes (a refusal as its reason code).
func TestPatchDeferredPublish(t *testing.T) {
	s := newServer()
	dh, ah := new(deferHook), new(afterHook)
	require.NoError(t, s.AddHook(dh, nil))
	require.NoError(t, s.AddHook(ah, nil))
	cl, r, w := newTestClient()
	cl.Properties.ProtocolVersion = 5
	pub := func(id uint16, qos byte, payload string) packets.Packet {
		return packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos}, TopicName: "a/b", PacketID: id, Payload: []byte(payload)}
	}
	require.NoError(t, s.processPacket(cl, pub(1, 1, "one")))
	require.NoError(t, s.processPacket(cl, pub(2, 1, "two")))
	require.NoError(t, s.processPacket(cl, pub(3, 1, "three")))
	require.NoError(t, s.processPacket(cl, pub(0, 0, "qos0"))) // not deferred
	require.Equal(t, []string{"qos0"}, ah.got(), "the hooks after the deferring one wait for Resume")
	require.Len(t, dh.deferred, 3)

	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	require.True(t, dh.deferred[0].Resume(nil), "the rest of the publish runs in Resume")
	require.True(t, dh.deferred[1].Resume(packets.ErrUnspecifiedError))
	require.False(t, dh.deferred[1].Resume(nil), "only the first Resume counts")
	require.True(t, dh.deferred[2].Resume(nil))
	_ = w.Close()
	require.Equal(t, []string{"qos0", "deferred:one", "deferred:three"}, ah.got())
	b := <-done
	require.GreaterOrEqual(t, len(b), 13)
	require.Equal(t, []byte{packets.Puback << 4, 2, 0, 1}, b[:4])
	require.Equal(t, []byte{packets.Puback << 4}, b[4:5], "the refusal (with its reason string)")
	require.Equal(t, []byte{0, 2, packets.ErrUnspecifiedError.Code}, b[6:9])
	require.Equal(t, []byte{packets.Puback << 4, 2, 0, 3}, b[len(b)-4:])
}

// Resume before the hook's OnPublish has returned (a store that answered at
// once) runs the rest on the reading goroutine.
func TestPatchDeferredPublishResumedEarly(t *testing.T) {
	s := newServer()
	ah := new(afterHook)
	require.NoError(t, s.AddHook(&earlyHook{}, nil))
	require.NoError(t, s.AddHook(ah, nil))
	cl, r, w := newTestClient()
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2}, TopicName: "a/b", PacketID: 7, Payload: []byte("x")}
	require.NoError(t, s.processPacket(cl, pk))
	require.Equal(t, []string{"x"}, ah.got())
	_ = w.Close()
	require.Equal(t, []byte{packets.Pubrec << 4, 2, 0, 7}, <-done)
	require.Equal(t, 1, cl.State.Inflight.Len(), "the PUBREC waits for its PUBREL")
}

type earlyHook struct{ HookBase }

func (h *earlyHook) ID() string { return "early" }

func (h *earlyHook) Provides(b byte) bool { return b == OnPublish }

func (h *earlyHook) OnPublish(_ *Client, pk packets.Packet) (packets.Packet, error) {
	d := DeferPublish()
	if d.Resume(nil) {
		panic("Resume ran the rest of a publish that OnPublish has not returned yet")
	}
	return pk, d
}
