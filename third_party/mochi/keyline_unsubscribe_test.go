package mqtt

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/mochi-mqtt/server/v2/packets"
)

type unsubRecorder struct {
	HookBase
	got []packets.Packet
}

func (h *unsubRecorder) ID() string                                   { return "unsub-recorder" }
func (h *unsubRecorder) Provides(b byte) bool                         { return b == OnUnsubscribed }
func (h *unsubRecorder) OnUnsubscribed(cl *Client, pk packets.Packet) { h.got = append(h.got, pk) }

func TestServerUnsubscribeFilters(t *testing.T) {
	s := newServer()
	rec := new(unsubRecorder)
	require.NoError(t, s.AddHook(rec, nil))
	cl, _, _ := newTestClient()
	for _, f := range []string{"a/b", "a/#", "c"} {
		pk := packets.Subscription{Filter: f, Qos: 1}
		cl.State.Subscriptions.Add(f, pk)
		s.Topics.Subscribe(cl.ID, pk)
	}
	s.Info.Subscriptions = 3
	require.Equal(t, 2, s.UnsubscribeFilters(cl, []string{"a/#", "c", "not/held"}))
	require.Equal(t, 1, cl.State.Subscriptions.Len())
	require.Equal(t, int64(1), s.Info.Subscriptions)
	require.Len(t, s.Topics.Subscribers("a/b").Subscriptions, 1)
	require.Len(t, s.Topics.Subscribers("c").Subscriptions, 0)
	require.Len(t, rec.got, 1)
	require.Len(t, rec.got[0].Filters, 2)
	require.Equal(t, 0, s.UnsubscribeFilters(cl, []string{"c"}))
	require.Len(t, rec.got, 1, "no hook call when nothing was held")
}
