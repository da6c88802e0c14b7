package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// expectInOrder reads want's messages from every subscriber, in order.
func expectInOrder(t *testing.T, want []string, subs map[string]*mqtttest.V5) {
	t.Helper()
	for name, s := range subs {
		for i, w := range want {
			if m := s.Next(t); string(m.Payload) != w {
				t.Fatalf("%s: message %d is %q, want %q (lost, reordered or a refused one delivered)", name, i, m.Payload, w)
			}
		}
		expectNone(t, s, name)
	}
}

// A publisher with many QoS 1 publishes in flight gets its PUBACKs in
// publish order; every message is stored and reaches subscribers on every
// node (the publisher's too) in publish order; the stores were in flight
// together; and a publish the stream refuses is answered 0x80, not
// acknowledged, and delivered nowhere, while those around it go on.
func TestClusterPipelinedQoS1Publishes(t *testing.T) {
	nc := natstest.Start(t, 3)
	bs := startClusterBrokers(t, 3, nc.URLs())
	subs := map[string]*mqtttest.V5{}
	for i, b := range bs {
		name := fmt.Sprintf("sub-%d", i)
		s := dialV5(t, b, &paho.Connect{ClientID: name, CleanStart: true, KeepAlive: 30})
		s.Subscribe(t, paho.SubscribeOptions{Topic: "pipe/#", QoS: 1})
		subs[name] = s
	}
	pub := mqtttest.DialRawPublisher(t, bs[0].Addr("tcp"), "pipe-pub")

	const n, window = 600, 100
	codes := pub.Pipelined(t, "pipe/a", n, window, func(i int) []byte { return fmt.Appendf(nil, "m%d", i) }, nil)
	want := make([]string, n)
	for i, c := range codes {
		if c != 0 {
			t.Fatalf("publish %d answered %#x", i, c)
		}
		want[i] = fmt.Sprintf("m%d", i)
	}
	if got := bs[0].ClusterNode().Stats.StoreWindowMax.Load(); got < 2 {
		t.Errorf("at most %d store of the publisher was in flight at once: not pipelined", got)
	}
	expectInOrder(t, want, subs)
	stored := streamMessages(t, nc.URLs()[0])

	// The stream now refuses messages over 200 bytes: every fourth publish
	// is larger. Those are refused with 0x80 in their place among the
	// acknowledgements, and delivered to nobody.
	setMaxMsgSize(t, nc.URLs()[0], 200)
	codes = pub.Pipelined(t, "pipe/b", n, window, func(i int) []byte {
		if i%4 == 3 {
			return make([]byte, 400)
		}
		return fmt.Appendf(nil, "b%d", i)
	}, nil)
	want = want[:0]
	for i, c := range codes {
		switch {
		case i%4 == 3 && c != packetsUnspecified:
			t.Fatalf("publish %d, too large for the stream, answered %#x, want 0x80", i, c)
		case i%4 != 3 && c != 0:
			t.Fatalf("publish %d answered %#x", i, c)
		case i%4 != 3:
			want = append(want, fmt.Sprintf("b%d", i))
		}
	}
	expectInOrder(t, want, subs)
	if got := streamMessages(t, nc.URLs()[0]) - stored; got != uint64(len(want)) {
		t.Errorf("the stream took %d messages of the second round, want the %d acknowledged", got, len(want))
	}
}

const packetsUnspecified = 0x80

func jsClient(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	c, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	js, err := jetstream.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func streamMessages(t *testing.T, url string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := jsClient(t, url).Stream(ctx, cluster.StreamMessages)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func setMaxMsgSize(t *testing.T, url string, size int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js := jsClient(t, url)
	st, err := js.Stream(ctx, cluster.StreamMessages)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.MaxMsgSize = size
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}
