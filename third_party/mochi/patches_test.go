// Tests of Keyline's changes to mochi v2.7.9 (PATCHES.md lists them).

package mqtt

import (
	"bytes"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mochi-mqtt/server/v2/packets"
)

// GetByListener took the clients' read lock twice (RLock, then Len's RLock):
// a writer queueing in between deadlocked both (mochi-mqtt/server#488), and
// with them the server's Close. The window is a few instructions wide, so
// the test hammers it; on v2.7.9 it hangs within a few thousand rounds.
func TestPatchGetByListenerTakesTheLockOnce(t *testing.T) {
	cls := NewClients()
	for i := 0; i < 8; i++ {
		cl, _, _ := newTestClient()
		cl.ID = string(rune('a' + i))
		cl.Net.Listener = "t1"
		cls.Add(cl)
	}
	extra, _, _ := newTestClient()
	extra.ID = "extra"
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				cls.Add(extra)
				cls.Delete(extra.ID)
			}
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200000; i++ {
			cls.GetByListener("t1")
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("GetByListener deadlocked against a concurrent writer")
	}
	close(stop)
	wg.Wait()
}

// An expired session's subscriptions leave the topic index: v2.7.9 deleted
// the client and kept its filters (and their index nodes) for good.
func TestPatchExpiredClientLeavesTheTopicIndex(t *testing.T) {
	s := New(&Options{Logger: logger})
	cl, _, _ := newTestClient()
	cl.ID = "gone"
	cl.ops.hooks = s.hooks
	cl.State.disconnected = time.Now().Unix() - 10
	cl.State.cancelOpen()
	cl.Properties.ProtocolVersion = 5
	cl.Properties.Props.SessionExpiryInterval = 5
	cl.Properties.Props.SessionExpiryIntervalFlag = true
	sub := packets.Subscription{Filter: "a/b/c", Qos: 1}
	cl.State.Subscriptions.Add(sub.Filter, sub)
	s.Topics.Subscribe(cl.ID, sub)
	s.Clients.Add(cl)
	require.Len(t, s.Topics.Subscribers("a/b/c").Subscriptions, 1)

	s.clearExpiredClients(time.Now().Unix())
	_, ok := s.Clients.Get("gone")
	require.False(t, ok)
	require.Empty(t, s.Topics.Subscribers("a/b/c").Subscriptions)
}

// patchedAck is the MQTT 5 ack mochi sends for a refused publish: the reason
// code and string, none of the publish's properties.
func patchedAck(typ byte, id uint16, reason packets.Code) []byte {
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: typ}, ProtocolVersion: 5, PacketID: id, ReasonCode: reason.Code,
		Properties: packets.Properties{ReasonString: reason.Reason}}
	var b bytes.Buffer
	if err := pk.PubrecEncode(&b); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// A publisher's user properties do not come back on its PUBACK: v2.7.9
// copied the PUBLISH's properties into the ack (and with them wrote the
// granted QoS, 0x01, as the PUBACK's reason code, which is none).
func TestPatchAcksInheritNoProperties(t *testing.T) {
	s := newServer()
	cl, r, w := newTestClient()
	cl.Properties.ProtocolVersion = 5
	pk := *packets.TPacketData[packets.Publish].Get(packets.TPublishQos1Mqtt5).Packet
	require.NotEmpty(t, pk.Properties.User)
	go func() {
		_ = s.processPacket(cl, pk)
		_ = w.Close()
	}()
	buf, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, []byte{packets.Puback << 4, 2, byte(pk.PacketID >> 8), byte(pk.PacketID)}, buf)
}

// awaitWritten waits (up to 10 s) until the client's write loop has written
// every packet queued for it.
func awaitWritten(cl *Client) {
	for deadline := time.Now().Add(10 * time.Second); atomic.LoadInt32(&cl.State.outboundQty) > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // polling: the write loop signals nothing
	}
}
