package hooks

import (
	"log/slog"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/keyshared"
)

// closedDispatch is a group dispatcher that has been closed.
type closedDispatch struct{ keyshared.Group }

func (closedDispatch) Ack(string, uint64) error          { return keyshared.ErrClosed }
func (closedDispatch) Nack(string, uint64, byte) error   { return keyshared.ErrClosed }
func (closedDispatch) Reject(string, uint64, byte) error { return keyshared.ErrClosed }

// TestAnswersToAClosedGroupAreCounted: a member's PUBACK, failed PUBACK
// (nack) and 0x87 (reject) that reach a closed dispatcher are counted, not
// swallowed.
func TestAnswersToAClosedGroupAreCounted(t *testing.T) {
	h := &KeyShared{inflight: newInflightTable()}
	h.Log = slog.New(slog.DiscardHandler)
	g := testGroup("w/jobs/#")
	g.d = closedDispatch{}
	cl := &mqtt.Client{ID: "member"}
	cl.Properties.ProtocolVersion = 5
	for i, reason := range []byte{0, 0x80, 0x87} {
		id := uint16(i + 1)
		h.inflight.track(cl.ID, id, g, uint64(10+i))
		h.ReadPacket(cl, &packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: id, ReasonCode: reason})
		if n := h.ResultsDropped.Load(); n != uint64(i+1) {
			t.Fatalf("after answer %#x: %d dropped answers counted, want %d", reason, n, i+1)
		}
	}
}
