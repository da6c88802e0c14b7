// Tests of Keyline's changes to mochi v2.7.9 (PATCHES.md lists them).

package mqtt

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net"
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
	var rounds atomic.Int64
	go func() {
		defer close(done)
		for i := 0; i < 200000; i++ {
			cls.GetByListener("t1")
			rounds.Add(1)
		}
	}()
	// A deadlock stops the rounds for good; a loaded machine only slows them
	// (one 30 s deadline for all of them failed under -race on the shared
	// machine). Fail when no round finished in 10 s.
	for last := int64(-1); ; {
		select {
		case <-done:
			close(stop)
			wg.Wait()
			return
		case <-time.After(10 * time.Second):
			n := rounds.Load()
			if n == last {
				close(stop) // the writer stops; a deadlocked reader stays stuck
				t.Fatalf("GetByListener deadlocked against a concurrent writer after %d rounds", n)
			}
			last = n
		}
	}
}

// An expired session's subscriptions leave the topic index: v2.7.9 deleted
// the client and kept its filters (and their index nodes) for good.
func TestPatchExpiredClientLeavesTheTopicIndex(t *testing.T) {
	s := New(&Options{Logger: logger})
	cl, _, _ := newTestClient()
	cl.ID = "gone"
	cl.ops.hooks = s.hooks
	cl.State.disconnected.Store(time.Now().Unix() - 10)
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

// captureConn is a net.Conn that keeps what is written to it; nothing is
// ever read from it (a Conn's owner reads).
type captureConn struct {
	mu     sync.Mutex
	out    bytes.Buffer
	closed bool
}

func (c *captureConn) Read([]byte) (int, error) { return 0, io.EOF }
func (c *captureConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return c.out.Write(b)
}
func (c *captureConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}
func (c *captureConn) LocalAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1883}
}
func (c *captureConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 50000}
}
func (c *captureConn) SetDeadline(time.Time) error      { return nil }
func (c *captureConn) SetReadDeadline(time.Time) error  { return nil }
func (c *captureConn) SetWriteDeadline(time.Time) error { return nil }
func (c *captureConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.out.Bytes())
}
func (c *captureConn) reset() { c.mu.Lock(); defer c.mu.Unlock(); c.out.Reset() }

func newPatchedServer() *Server {
	cc := NewDefaultServerCapabilities()
	cc.MaximumPacketSize = 1000
	s := New(&Options{Logger: logger, Capabilities: cc, DirectWrites: true, CompactSessions: true, InlineClient: true})
	_ = s.AddHook(new(AllowHook), nil)
	return s
}

var (
	connect311Persistent = packets.TPacketData[packets.Connect].Get(packets.TConnectMqtt311).RawBytes // client "zen", clean session 0
	subscribeABC         = []byte{packets.Subscribe<<4 | 1<<1, 10, 0, 15, 0, 5, 'a', '/', 'b', '/', 'c', 1}
	pingreq              = []byte{packets.Pingreq << 4, 0}
	disconnect           = []byte{packets.Disconnect << 4, 0}
)

// A Conn is fed the bytes its owner reads, split anywhere: packets are
// handled as they complete, with nothing but an incomplete packet's bytes
// kept between calls; a DISCONNECT ends it (ErrClientStopped).
func TestPatchConnFeedsPacketsSplitAnywhere(t *testing.T) {
	s := newPatchedServer()
	out := new(captureConn)
	c := s.NewConn("t1", out)
	for i := range connect311Persistent { // one byte at a time
		require.NoError(t, c.Feed(connect311Persistent[i:i+1]))
		if i < len(connect311Persistent)-1 {
			require.Equal(t, i+1, c.Pending())
		}
	}
	require.Equal(t, 0, c.Pending())
	require.Equal(t, []byte{packets.Connack << 4, 2, 0, 0}, out.written())
	cl, ok := s.Clients.Get("zen")
	require.True(t, ok)
	require.Same(t, c.Client(), cl)
	require.Nil(t, cl.Net.bconn, "a fed client has no reader of its own")
	require.Nil(t, cl.State.outbound, "DirectWrites: no outbound channel")

	out.reset()
	stream := append(append(append([]byte{}, subscribeABC...), pingreq...), disconnect...)
	require.NoError(t, c.Feed(stream[:7]))
	require.Equal(t, 7, c.Pending())
	require.ErrorIs(t, c.Feed(stream[7:]), ErrClientStopped) // SUBSCRIBE, PINGREQ, then DISCONNECT
	require.Equal(t, []byte{packets.Suback << 4, 3, 0, 15, 1, packets.Pingresp << 4, 0}, out.written())
	require.NoError(t, c.End(ErrClientStopped))
	require.Equal(t, int64(0), atomic.LoadInt64(&s.Info.ClientsConnected))
}

// The first packet must be a CONNECT, and no packet may be larger than
// MaximumPacketSize: both are refused from the fixed header, before the body.
func TestPatchConnRefusesFromTheFixedHeader(t *testing.T) {
	s := newPatchedServer()
	c := s.NewConn("t1", new(captureConn))
	err := c.Feed([]byte{packets.Publish << 4, 0x80})
	require.ErrorIs(t, err, packets.ErrProtocolViolationRequireFirstConnect)
	require.NoError(t, c.End(nil)) // not attached: nothing to undo
	c = s.NewConn("t1", new(captureConn))
	require.NoError(t, c.Feed(connect311Persistent))
	require.ErrorIs(t, c.Feed([]byte{packets.Publish << 4, 0xe8, 0x07}), packets.ErrPacketTooLarge) // 1000 bytes + 1 > 1000
	require.Equal(t, 0, c.Pending())
	_ = c.End(packets.ErrPacketTooLarge)
}

// A slow sender holds only what it sent: a PUBLISH announcing 990 bytes of
// which 10 came keeps 13 bytes, not a buffer of 990.
func TestPatchConnKeepsOnlyWhatArrived(t *testing.T) {
	s := newPatchedServer()
	c := s.NewConn("t1", new(captureConn))
	require.NoError(t, c.Feed(connect311Persistent))
	head := []byte{packets.Publish << 4, 0xde, 0x07, 0, 5, 'a', '/', 'b', '/', 'c', 'x', 'y', 'z'} // remaining 990
	require.NoError(t, c.Feed(head))
	require.Equal(t, len(head), c.Pending())
	require.LessOrEqual(t, cap(c.partial), 64)
	_ = c.End(io.EOF)
}

// A connection that ends without DISCONNECT sends the client's will; one
// that disconnects does not.
func TestPatchConnEndSendsTheWill(t *testing.T) {
	s := newPatchedServer()
	got := make(chan string, 2)
	require.NoError(t, s.Subscribe("lwt", 1, func(_ *Client, _ packets.Subscription, pk packets.Packet) { got <- string(pk.Payload) }))
	will := packets.TPacketData[packets.Connect].Get(packets.TConnectUserPassLWT).RawBytes
	for _, end := range []error{io.EOF, ErrClientStopped} {
		c := s.NewConn("t1", new(captureConn))
		require.NoError(t, c.Feed(will))
		require.True(t, c.Client().Properties.Will.Flag == 1)
		_ = c.End(end)
	}
	require.Len(t, got, 1, "one will: for the connection that ended without DISCONNECT")
}

// A disconnected persistent session is kept as a compact record: none of
// its connection's state, all of its session's, and it resumes.
func TestPatchOfflineSessionIsCompact(t *testing.T) {
	s := newPatchedServer()
	c := s.NewConn("t1", new(captureConn))
	require.NoError(t, c.Feed(append(append([]byte{}, connect311Persistent...), subscribeABC...)))
	live := c.Client()
	_ = c.End(io.EOF)

	off, ok := s.Clients.Get("zen")
	require.True(t, ok)
	require.NotSame(t, live, off)
	require.True(t, off.Closed())
	require.Nil(t, off.Net.Conn)
	require.Nil(t, off.State.TopicAliases.Inbound)
	require.Equal(t, live.StopTime(), off.StopTime())
	require.Equal(t, live.State.Subscriptions, off.State.Subscriptions)
	off.Stop(nil) // does nothing
	require.Equal(t, live.StopTime(), off.StopTime())

	out := new(captureConn)
	c = s.NewConn("t1", out)
	require.NoError(t, c.Feed(connect311Persistent))
	require.Equal(t, []byte{packets.Connack << 4, 2, 1, 0}, out.written(), "session present")
	cl, _ := s.Clients.Get("zen")
	_, subscribed := cl.State.Subscriptions.Get("a/b/c")
	require.True(t, subscribed)
	_ = c.End(ErrClientStopped)
}

// Subscriptions keeps up to smallSubscriptions entries without a map and
// moves them to one beyond; both forms answer alike.
func TestPatchSubscriptionsSmallThenMap(t *testing.T) {
	s := NewSubscriptions()
	want := map[string]packets.Subscription{}
	check := func() {
		t.Helper()
		require.Equal(t, len(want), s.Len())
		require.Equal(t, want, s.GetAll())
		for id, sub := range want {
			got, ok := s.Get(id)
			require.True(t, ok)
			require.Equal(t, sub, got)
		}
		_, ok := s.Get("absent")
		require.False(t, ok)
	}
	for i := 0; i < 2*smallSubscriptions; i++ {
		id := string(rune('a' + i))
		s.Add(id, packets.Subscription{Filter: id, Qos: byte(i % 3)})
		want[id] = packets.Subscription{Filter: id, Qos: byte(i % 3)}
		s.Add(id, packets.Subscription{Filter: id, Qos: 2}) // replaced, not added
		want[id] = packets.Subscription{Filter: id, Qos: 2}
		check()
		if i < smallSubscriptions {
			require.Nil(t, s.internal)
		} else {
			require.Nil(t, s.small)
		}
	}
	for id := range want {
		s.Delete(id)
		delete(want, id)
		check()
	}
	s2 := NewSubscriptions()
	s2.Add("x", packets.Subscription{})
	s2.Delete("x")
	require.Nil(t, s2.small, "an emptied small set lets go of its array")
}

// qosHook records the packets of its OnQosPublish and OnQosComplete calls.
type qosHook struct {
	HookBase
	mu        sync.Mutex
	published []packets.Packet
	completed []packets.Packet
}

func (h *qosHook) ID() string { return "qos-recorder" }
func (h *qosHook) Provides(b byte) bool {
	return b == OnQosPublish || b == OnQosComplete
}
func (h *qosHook) OnQosPublish(_ *Client, pk packets.Packet, _ int64, _ int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.published = append(h.published, pk)
}
func (h *qosHook) OnQosComplete(_ *Client, pk packets.Packet) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.completed = append(h.completed, pk)
}

// A QoS 1 publish is acknowledged without its PUBACK passing through the
// in-flight table (v2.7.9 set it there and deleted it right after the write,
// an 808-byte Packet allocated and freed per publish); with nothing in flight
// the OnQos hooks are not called (item 18), and the receive quota is given
// back. A QoS 2 publish's PUBREC is still held until its PUBREL.
func TestPatchQos1AckIsNotHeldInFlight(t *testing.T) {
	s := newServer()
	h := new(qosHook)
	require.NoError(t, s.AddHook(h, nil))
	cl, r, w := newTestClient()
	quota := atomic.LoadInt32(&cl.State.Inflight.receiveQuota)
	pk := *packets.TPacketData[packets.Publish].Get(packets.TPublishQos1).Packet
	go func() {
		_ = s.processPacket(cl, pk)
		_ = w.Close()
	}()
	buf, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, []byte{packets.Puback << 4, 2, byte(pk.PacketID >> 8), byte(pk.PacketID)}, buf)
	require.Empty(t, h.published, "nothing is in flight: no OnQosPublish (item 18)")
	require.Empty(t, h.completed)
	require.Equal(t, 0, cl.State.Inflight.Len())
	require.Equal(t, int64(0), atomic.LoadInt64(&s.Info.Inflight))
	require.Equal(t, quota, atomic.LoadInt32(&cl.State.Inflight.receiveQuota))

	cl2, r2, w2 := newTestClient()
	pk2 := *packets.TPacketData[packets.Publish].Get(packets.TPublishQos2).Packet
	go func() {
		_ = s.processPacket(cl2, pk2)
		_ = w2.Close()
	}()
	_, err = io.ReadAll(r2)
	require.NoError(t, err)
	require.Equal(t, 1, cl2.State.Inflight.Len(), "the PUBREC waits for its PUBREL")
}

// BenchmarkPatchQos1Publish is one QoS 1 publish (no subscriber) and its
// PUBACK, written straight to the connection (DirectWrites).
func BenchmarkPatchQos1Publish(b *testing.B) {
	s := newPatchedServer()
	c := new(captureConn)
	cl := s.NewClient(c, "t1", "bench", false)
	cl.State.Inflight.ResetReceiveQuota(1024)
	pk := *packets.TPacketData[packets.Publish].Get(packets.TPublishQos1).Packet
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := s.processPacket(cl, pk); err != nil {
			b.Fatal(err)
		}
		c.reset()
	}
}

// BenchmarkPatchSubscribersMiss is the topic walk for a topic nobody
// subscribed to, in an index holding 10,000 clients' filters of their own and
// one shared subscription on "#" (as Keyline's fan-out hook keeps one).
func BenchmarkPatchSubscribersMiss(b *testing.B) {
	x := NewTopicsIndex()
	for i := 0; i < 10_000; i++ {
		x.Subscribe(fmt.Sprintf("c%d", i), packets.Subscription{Filter: fmt.Sprintf("dev/%d/cmd", i)})
	}
	x.Subscribe("placeholder", packets.Subscription{Filter: SharePrefix + "/keyline/#"})
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_ = x.Subscribers("dev/42/tele")
	}
}

// A session ends when its interval has passed, to the nanosecond, and a
// client reconnecting after that finds no session even if the sweep has not
// come round yet: v2.7.9 counted whole seconds (disconnected+interval < now)
// and swept once a second, so a session lived up to two seconds too long
// (the paho interoperability suite's test_session_expiry saw it present).
func TestPatchSessionExpiresToTheInterval(t *testing.T) {
	s := New(&Options{Logger: logger})
	cl, _, _ := newTestClient()
	cl.ID = "short"
	cl.ops.hooks = s.hooks
	cl.Properties.ProtocolVersion = 5
	cl.Properties.Props.SessionExpiryInterval = 1
	cl.Properties.Props.SessionExpiryIntervalFlag = true
	sub := packets.Subscription{Filter: "a/b", Qos: 1}
	cl.State.Subscriptions.Add(sub.Filter, sub)
	s.Topics.Subscribe(cl.ID, sub)
	s.Clients.Add(cl)
	cl.Stop(nil)
	stopped := time.Unix(0, cl.State.stoppedAt.Load())
	require.False(t, s.sessionExpiredAt(cl, stopped.Add(999*time.Millisecond)))
	require.True(t, s.sessionExpiredAt(cl, stopped.Add(time.Second)))

	// Back-date the end by 1.2 s within the same second as now: whole
	// seconds would call it alive for up to two more.
	cl.State.stoppedAt.Store(time.Now().Add(-1200 * time.Millisecond).UnixNano())
	cl.State.disconnected.Store(time.Now().Unix())
	next, _, _ := newTestClient()
	next.ID = "short"
	require.False(t, s.inheritClientSession(packets.Packet{}, next), "the expired session was resumed")
	require.Empty(t, s.Topics.Subscribers("a/b").Subscriptions)
	_, ok := s.Clients.Get("short")
	require.False(t, ok)
}

// A delayed will is sent within willDelayTick of its delay (v2.7.9 kept its
// due time in seconds and looked each second: up to two seconds late), and
// ticks before any will is due do not scan the delayed wills.
func TestPatchDelayedWillIsDueToTheMillisecond(t *testing.T) {
	s := newServer()
	cl1, _, _ := newTestClient()
	cl1.ID = "cl1"
	cl1.Properties.Will = Will{Flag: 1, TopicName: "a/b/c", Payload: []byte("hello"), WillDelayInterval: 2}
	s.Clients.Add(cl1)

	before := time.Now().UnixMilli()
	s.sendLWT(cl1)
	pk, ok := s.loop.willDelayed.Get(cl1.ID)
	require.True(t, ok)
	require.GreaterOrEqual(t, pk.Expiry, before+2000)
	require.LessOrEqual(t, pk.Expiry, time.Now().UnixMilli()+2000)
	require.Equal(t, pk.Expiry, s.loop.nextWill.Load(), "the next due will")

	s.sendDelayedLWT(pk.Expiry - 1)
	require.Equal(t, 1, s.loop.willDelayed.Len(), "sent before it was due")
	require.Equal(t, pk.Expiry, s.loop.nextWill.Load())
	s.sendDelayedLWT(pk.Expiry)
	require.Equal(t, 0, s.loop.willDelayed.Len(), "not sent when due")
	require.Equal(t, int64(math.MaxInt64), s.loop.nextWill.Load(), "nothing is due")
}

// The server's and the client's packet ids are two spaces [MQTT-2.2.1-3]: a
// client's QoS 1 or 2 PUBLISH with the id of a message the server has in
// flight to it leaves that message in flight, and the acks of one direction
// do not complete the other's. v2.7.9 kept both in one table: the client's
// PUBLISH deleted (QoS 1) or overwrote (QoS 2) the server's entry, and the
// client's PUBACK for the server's message deleted the client's PUBREC.
func TestPatchInflightDirectionsAreSeparate(t *testing.T) {
	s := newServer()
	cl, r, w := newTestClient()
	defer w.Close()
	go func() { _, _ = io.Copy(io.Discard, r) }()
	cl.Properties.ProtocolVersion = 4
	cl.State.Inflight.ResetReceiveQuota(10)
	cl.State.Inflight.ResetSendQuota(10)

	const id = 7
	out := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: id, TopicName: "to/client", Payload: []byte("out")}
	require.True(t, cl.State.Inflight.Set(out))
	publish := func(qos byte) packets.Packet {
		return packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: qos}, PacketID: id, TopicName: "from/client", Payload: []byte("in")}
	}
	ack := func(typ byte) packets.Packet {
		return packets.Packet{FixedHeader: packets.FixedHeader{Type: typ, Qos: map[byte]byte{packets.Pubrel: 1}[typ]}, PacketID: id}
	}

	require.NoError(t, s.processPacket(cl, publish(1)))
	got, ok := cl.State.Inflight.Get(id)
	require.True(t, ok, "a client's QoS 1 PUBLISH deleted the server's message with its id")
	require.Equal(t, "to/client", got.TopicName)

	require.NoError(t, s.processPacket(cl, publish(2)))
	got, ok = cl.State.Inflight.Get(id)
	require.True(t, ok)
	require.Equal(t, packets.Publish, got.FixedHeader.Type, "a client's QoS 2 PUBLISH overwrote the server's message with its id")
	rec, ok := cl.State.Inflight.GetInbound(id)
	require.True(t, ok)
	require.Equal(t, packets.Pubrec, rec.FixedHeader.Type)
	require.Equal(t, 2, cl.State.Inflight.Len())

	// A retransmission of the client's PUBLISH is still recognised.
	require.NoError(t, s.processPacket(cl, publish(2)))
	require.Equal(t, 2, cl.State.Inflight.Len())

	// The client acknowledges the server's message: the client's PUBREC stays.
	require.NoError(t, s.processPacket(cl, ack(packets.Puback)))
	_, ok = cl.State.Inflight.Get(id)
	require.False(t, ok)
	_, ok = cl.State.Inflight.GetInbound(id)
	require.True(t, ok, "the client's PUBACK deleted the PUBREC of its own publish")

	// A server message with the same id again, then the client's PUBREL:
	// only the client's flow completes.
	require.True(t, cl.State.Inflight.Set(out))
	require.NoError(t, s.processPacket(cl, ack(packets.Pubrel)))
	_, ok = cl.State.Inflight.GetInbound(id)
	require.False(t, ok)
	_, ok = cl.State.Inflight.Get(id)
	require.True(t, ok, "the client's PUBREL completed the server's message")
	require.Equal(t, 1, cl.State.Inflight.Len())
}

// A delayed will cancelled for its client (its session went on over a
// connection on another node) is not sent, whether it was pending or the
// connection closes after the cancel; a will without a delay still is.
func TestPatchCancelDelayedWill(t *testing.T) {
	s := newServer()
	pending, _, _ := newTestClient()
	pending.ID = "pending"
	pending.Properties.Will = Will{Flag: 1, TopicName: "a/b/c", Payload: []byte("hello"), WillDelayInterval: 2}
	s.Clients.Add(pending)
	s.sendLWT(pending)
	require.Equal(t, 1, s.loop.willDelayed.Len())
	s.CancelDelayedWill(pending)
	require.Equal(t, 0, s.loop.willDelayed.Len(), "a pending will kept")

	later, _, _ := newTestClient()
	later.ID = "later"
	later.Properties.Will = Will{Flag: 1, TopicName: "a/b/c", Payload: []byte("hello"), WillDelayInterval: 2}
	s.Clients.Add(later)
	s.CancelDelayedWill(later)
	s.sendLWT(later)
	require.Equal(t, 0, s.loop.willDelayed.Len(), "a will cancelled before the close kept")

	now, _, _ := newTestClient()
	now.ID = "now"
	now.Properties.Will = Will{Flag: 1, TopicName: "a/b/c", Payload: []byte("hello")}
	s.Clients.Add(now)
	s.CancelDelayedWill(now)
	s.sendLWT(now)
	require.Equal(t, uint32(0), now.Properties.Will.Flag, "a will without a delay not sent")
}

type dropWillHook struct {
	HookBase
	sent int
}

func (h *dropWillHook) ID() string { return "drop-will" }

func (h *dropWillHook) Provides(b byte) bool { return b == OnWill || b == OnWillSent }

func (h *dropWillHook) OnWill(_ *Client, will Will) (Will, error) {
	if will.TopicName == "denied" {
		return will, packets.ErrRejectPacket
	}
	return will, nil
}

func (h *dropWillHook) OnWillSent(*Client, packets.Packet) { h.sent++ }

// TestPatchWillDropped: a hook's OnWill answering packets.ErrRejectPacket
// drops the will (item 24), delayed or not; another will still goes.
func TestPatchWillDropped(t *testing.T) {
	s := newServer()
	h := new(dropWillHook)
	require.NoError(t, s.AddHook(h, nil))
	for i, delay := range []uint32{0, 2} {
		cl, _, _ := newTestClient()
		cl.ID = fmt.Sprintf("denied-%d", i)
		cl.Properties.Will = Will{Flag: 1, TopicName: "denied", Payload: []byte("x"), WillDelayInterval: delay}
		s.Clients.Add(cl)
		s.sendLWT(cl)
		require.Equal(t, uint32(0), cl.Properties.Will.Flag, "a dropped will is gone")
		require.Equal(t, 0, s.loop.willDelayed.Len(), "a dropped will waits for its delay")
	}
	require.Equal(t, 0, h.sent)
	ok, _, _ := newTestClient()
	ok.ID = "ok"
	ok.Properties.Will = Will{Flag: 1, TopicName: "allowed", Payload: []byte("x")}
	s.Clients.Add(ok)
	s.sendLWT(ok)
	require.Equal(t, 1, h.sent, "another will is sent")
}

// The clients of a server's Conns share one ops (PATCHES.md item 25): each
// made its own 32 bytes, which every offline session record kept too.
func TestPatchConnClientsShareOps(t *testing.T) {
	s := newPatchedServer()
	a, b := s.NewConn("t1", new(captureConn)), s.NewConn("t1", new(captureConn))
	require.Same(t, a.Client().ops, b.Client().ops)
	require.Same(t, s.Options, a.Client().ops.options)
	require.Same(t, s.hooks, a.Client().ops.hooks)
	require.NoError(t, a.End(nil))
	require.NoError(t, b.End(nil))
}

// A topic index node makes its shared and inline subscription sets with its
// first such subscription (PATCHES.md item 27); they work from then on, also
// while the topic walk reads the node from another goroutine.
func TestPatchIndexNodeSetsMadeOnFirstUse(t *testing.T) {
	x := NewTopicsIndex()
	x.Subscribe("cl1", packets.Subscription{Filter: "a/b", Qos: 1})
	n := x.seek("a/b", 0)
	require.NotNil(t, n)
	require.Nil(t, n.shared.Load(), "a node with a plain subscription made a shared set")
	require.Nil(t, n.inlineSubscriptions.Load(), "a node with a plain subscription made an inline set")

	done := make(chan struct{})
	walked := make(chan int)
	go func() { // the walk, while the sets are made
		n := 0
		for {
			select {
			case <-done:
				walked <- n
				return
			default:
				subs := x.Subscribers("a/b")
				n += len(subs.Shared) + len(subs.InlineSubscriptions)
			}
		}
	}()
	for i := 0; i < 50; i++ {
		x.Subscribe(fmt.Sprintf("cl%d", i), packets.Subscription{Filter: "$share/g/a/b", Qos: 1})
		x.InlineSubscribe(InlineSubscription{Subscription: packets.Subscription{Filter: "a/b", Identifier: i + 1}})
	}
	close(done)
	<-walked

	subs := x.Subscribers("a/b")
	require.Len(t, subs.Subscriptions, 1)
	require.Len(t, subs.Shared["$share/g/a/b"], 50)
	require.Len(t, subs.InlineSubscriptions, 50)
	require.True(t, x.Unsubscribe("$share/g/a/b", "cl3"))
	require.Equal(t, 49, n.shared.Load().Len())
	require.True(t, x.InlineUnsubscribe(1, "a/b"))
	require.Equal(t, 49, n.inlineSubscriptions.Load().Len())
}

// Keyline's item 29: an empty in-flight table answers Get without its lock,
// and a table with entries still finds them (and misses the others).
func TestInflightEmptyGetWithoutLock(t *testing.T) {
	i := NewInflights()
	i.Lock() // a look-up that took the read lock would wait here
	done := make(chan bool)
	go func() {
		_, ok := i.Get(7)
		_, okIn := i.GetInbound(7)
		done <- ok || okIn
	}()
	select {
	case found := <-done:
		require.False(t, found)
	case <-time.After(10 * time.Second):
		t.Fatal("Get on an empty table waited for the lock")
	}
	i.Unlock()

	require.True(t, i.Set(packets.Packet{PacketID: 7, FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}}))
	_, ok := i.Get(7)
	require.True(t, ok)
	_, ok = i.Get(8)
	require.False(t, ok)
	_, ok = i.GetInbound(7)
	require.False(t, ok)
	require.True(t, i.Delete(7))
	_, ok = i.Get(7)
	require.False(t, ok)
}
