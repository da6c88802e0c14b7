// Tests of Keyline's changes to mochi (PATCHES.md): topic depth.

package mqtt

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/stretchr/testify/require"
)

// deepTopic returns a topic of n levels named level.
func deepTopic(level string, n int) string {
	return strings.TrimSuffix(strings.Repeat(level+"/", n), "/")
}

// readPacket decodes the one packet in buf.
func readPacket(t *testing.T, version byte, buf []byte) packets.Packet {
	t.Helper()
	pk := packets.Packet{ProtocolVersion: version}
	require.NoError(t, pk.FixedHeader.Decode(buf[0]))
	n, bu, err := packets.DecodeLength(strings.NewReader(string(buf[1:])))
	require.NoError(t, err)
	body := buf[1+bu : 1+bu+n]
	pk.FixedHeader.Remaining = n
	switch pk.FixedHeader.Type {
	case packets.Suback:
		require.NoError(t, pk.SubackDecode(body))
	case packets.Puback, packets.Pubrec:
		require.NoError(t, pk.PubackDecode(body))
	default:
		t.Fatalf("unexpected packet %v", pk.FixedHeader.Type)
	}
	return pk
}

func TestTopicsIndexDeepTopics(t *testing.T) {
	const levels = 10_000
	index := NewTopicsIndex()
	deep := deepTopic("a", levels)
	index.Subscribe("plus", packets.Subscription{Filter: deepTopic("+", levels)})
	index.Subscribe("hash", packets.Subscription{Filter: deepTopic("a", levels/2) + "/#"})
	index.Subscribe("exact", packets.Subscription{Filter: deep})
	index.Subscribe("shorter", packets.Subscription{Filter: deepTopic("a", levels-1)})
	index.Subscribe("shared", packets.Subscription{Filter: "$share/g/" + deepTopic("+", levels)})
	subs := index.Subscribers(deep)
	require.Len(t, subs.Subscriptions, 3)
	for _, id := range []string{"plus", "hash", "exact"} {
		require.Contains(t, subs.Subscriptions, id)
	}
	require.Len(t, subs.Shared, 1)

	index.RetainMessage(packets.Packet{TopicName: deep, Payload: []byte("x"), FixedHeader: packets.FixedHeader{Retain: true}})
	index.RetainMessage(packets.Packet{TopicName: "$SYS/a", Payload: []byte("x"), FixedHeader: packets.FixedHeader{Retain: true}})
	require.Len(t, index.Messages(deepTopic("+", levels)), 1)
	require.Len(t, index.Messages(deepTopic("a", 3)+"/#"), 1)
	require.Len(t, index.Messages("#"), 1) // not $SYS/a
	require.Len(t, index.Messages("$SYS/#"), 1)
	require.Empty(t, index.Messages(deepTopic("+", levels-1)))

	require.True(t, index.Unsubscribe(deep, "exact"))
	require.NotContains(t, index.Subscribers(deep).Subscriptions, "exact")
}

// BenchmarkSubscribersDepth reports the cost per level of finding a deep
// topic's subscribers: constant per level since the walk is linear (v2.7.9
// rescanned the topic for each level: 10,000 levels cost 100 times more per
// level than 100).
func BenchmarkSubscribersDepth(b *testing.B) {
	for _, levels := range []int{100, 1000, 10_000} {
		b.Run(fmt.Sprintf("levels=%d", levels), func(b *testing.B) {
			index := NewTopicsIndex()
			topic := deepTopic("level", levels)
			index.Subscribe("plus", packets.Subscription{Filter: deepTopic("+", levels)})
			index.Subscribe("exact", packets.Subscription{Filter: topic})
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				index.Subscribers(topic)
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N)/float64(levels), "ns/level")
		})
	}
}

func TestServerProcessSubscribeTooDeep(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			s := newServer()
			s.Options.Capabilities.MaximumTopicLevels = 4
			cl, r, w := newTestClient()
			cl.Properties.ProtocolVersion = version
			pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, PacketID: 7, ProtocolVersion: version,
				Filters: packets.Subscriptions{{Filter: "a/b/c/d"}, {Filter: "a/b/c/d/e"}, {Filter: "$share/g/a/b/c/d"}, {Filter: "+/+/+/+/#"}}}
			go func() {
				require.NoError(t, s.processSubscribe(cl, pk))
				_ = w.Close()
			}()
			buf, err := io.ReadAll(r)
			require.NoError(t, err)
			refused := packets.ErrTopicFilterInvalid.Code
			if version < 5 {
				refused = packets.ErrUnspecifiedError.Code
			}
			require.Equal(t, []byte{0, refused, 0, refused}, readPacket(t, version, buf).ReasonCodes)
			require.Equal(t, 2, cl.State.Subscriptions.Len())
		})
	}
}

func TestServerProcessPublishTooDeep(t *testing.T) {
	for _, tc := range []struct {
		version, qos byte
		closed       bool
	}{{5, 0, false}, {5, 1, false}, {5, 2, false}, {4, 0, false}, {4, 1, true}} {
		t.Run(fmt.Sprintf("v%d/qos%d", tc.version, tc.qos), func(t *testing.T) {
			s := newServer()
			s.Options.Capabilities.MaximumTopicLevels = 4
			cl, r, w := newTestClient()
			cl.Properties.ProtocolVersion = tc.version
			s.Clients.Add(cl)
			sub, sr, sw := newTestClient()
			sub.ID = "sub"
			s.Clients.Add(sub)
			s.Topics.Subscribe(sub.ID, packets.Subscription{Filter: "#"})
			pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: tc.qos}, TopicName: "a/b/c/d/e", Payload: []byte("x")}
			if tc.qos > 0 {
				pk.PacketID = 9
			}
			go func() {
				_ = s.processPublish(cl, pk)
				_ = w.Close()
				_ = sw.Close()
			}()
			buf, err := io.ReadAll(r)
			require.NoError(t, err)
			delivered, err := io.ReadAll(sr)
			require.NoError(t, err)
			require.Empty(t, delivered, "the publish must not be delivered")
			require.Equal(t, tc.closed, cl.Closed())
			switch {
			case tc.version == 5 && tc.qos > 0:
				require.Equal(t, packets.ErrTopicNameInvalid.Code, readPacket(t, 5, buf).ReasonCode)
			default: // QoS 0 is dropped; MQTT 3.1.1 is closed without a DISCONNECT
				require.Empty(t, buf)
			}
		})
	}
}

func TestServerValidateConnectClientIDTooLong(t *testing.T) {
	s := newServer()
	s.Options.Capabilities.MaximumClientIDLength = 8
	cl, _, _ := newTestClient()
	pk := *packets.TPacketData[packets.Connect].Get(packets.TConnectMqtt311).Packet
	cl.ID = "12345678"
	require.Equal(t, packets.CodeSuccess, s.validateConnect(cl, pk))
	cl.ID = "123456789"
	require.Equal(t, packets.ErrClientIdentifierTooLong, s.validateConnect(cl, pk))
}

func TestServerValidateConnectWillTooDeep(t *testing.T) {
	s := newServer()
	s.Options.Capabilities.MaximumTopicLevels = 4
	cl, _, _ := newTestClient()
	pk := *packets.TPacketData[packets.Connect].Get(packets.TConnectMqtt311).Packet
	cl.Properties.Will.TopicName = "a/b/c/d"
	require.Equal(t, packets.CodeSuccess, s.validateConnect(cl, pk))
	cl.Properties.Will.TopicName = "a/b/c/d/e"
	require.Equal(t, packets.ErrTopicNameInvalid, s.validateConnect(cl, pk))
}

func TestServerProcessSubscribeQuota(t *testing.T) {
	for _, version := range []byte{4, 5} {
		t.Run(fmt.Sprintf("v%d", version), func(t *testing.T) {
			s := newServer()
			s.Options.Capabilities.MaximumClientSubscriptions = 2
			s.Options.Capabilities.MaximumSubscriptions = 3
			subscribe := func(cl *Client, r io.Reader, w io.Closer, filters ...string) []byte {
				pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, PacketID: 7, ProtocolVersion: version}
				for _, f := range filters {
					pk.Filters = append(pk.Filters, packets.Subscription{Filter: f})
				}
				go func() {
					require.NoError(t, s.processSubscribe(cl, pk))
					_ = w.Close()
				}()
				buf, err := io.ReadAll(r)
				require.NoError(t, err)
				return readPacket(t, version, buf).ReasonCodes
			}
			refused := packets.ErrQuotaExceeded.Code
			if version < 5 {
				refused = packets.ErrUnspecifiedError.Code
			}
			a, ra, wa := newTestClient()
			a.Properties.ProtocolVersion = version
			// The third filter is one too many for a; a filter it holds is a replacement.
			require.Equal(t, []byte{0, 0, refused}, subscribe(a, ra, wa, "a", "b", "c"))
			a, ra, wa = newTestClient()
			a.Properties.ProtocolVersion = version
			a.State.Subscriptions.Add("a", packets.Subscription{Filter: "a"})
			a.State.Subscriptions.Add("b", packets.Subscription{Filter: "b"})
			require.Equal(t, []byte{0}, subscribe(a, ra, wa, "a"))
			b, rb, wb := newTestClient()
			b.ID = "b"
			b.Properties.ProtocolVersion = version
			// Two held by a, one more for b, then the server is full.
			require.Equal(t, []byte{0, refused}, subscribe(b, rb, wb, "x", "y"))
		})
	}
}
