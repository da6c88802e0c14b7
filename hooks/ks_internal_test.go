package hooks

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/keyline-mq/keyline/internal/poll"
	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// chanOut is a Deliverer that sends every delivery on a channel and takes them all.
type chanOut struct {
	c       chan keyshared.Message
	mu      sync.Mutex
	revoked []uint64
}

func (o *chanOut) Deliver(_ string, m *keyshared.Message, _ int) bool {
	select {
	case o.c <- *m:
		return true
	default:
		return false
	}
}

func (o *chanOut) Revoke(_ string, offset uint64) {
	o.mu.Lock()
	o.revoked = append(o.revoked, offset)
	o.mu.Unlock()
}

func newInternalFixture(t *testing.T, backlog persistence.GroupConfig) (*KeyShared, persistence.GroupStore) {
	t.Helper()
	server := mqtt.New(&mqtt.Options{})
	db, err := persistence.Open(t.TempDir(), persistence.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	store := db.Groups()
	h := NewKeyShared(server, keyshared.NewLocalBackend(store), KeySharedConfig{
		KeyProperty: "key",
		GroupSettings: func(string) (keyshared.Config, persistence.GroupConfig) {
			return keyshared.DefaultConfig(), backlog
		},
	})
	if err := server.AddHook(h, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = h.Stop()
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return h, store
}

func recv(t *testing.T, c <-chan keyshared.Message) keyshared.Message {
	t.Helper()
	select {
	case m := <-c:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10s")
		return keyshared.Message{}
	}
}

func TestInternalGroupTakesPublishesAndStaysHidden(t *testing.T) {
	h, store := newInternalFixture(t, persistence.GroupConfig{})
	if _, err := h.OpenInternal(share.Name{Share: "orders", Filter: "#"}, &chanOut{}); !errors.Is(err, ErrNotInternal) {
		t.Fatalf("OpenInternal of a client group: %v", err)
	}
	n := share.Name{Share: share.InternalPrefix + "bridge.cloud", Filter: "sensors/#"}
	out := &chanOut{c: make(chan keyshared.Message, 16)}
	ig, err := h.OpenInternal(n, out)
	if err != nil {
		t.Fatal(err)
	}
	if err := ig.AddMember("bridge:cloud", 0); err != nil {
		t.Fatal(err)
	}
	// A client group on the same topics, so the injector's skip is seen to
	// choose among groups.
	if _, err := h.ensureGroup(share.Name{Share: "workers", Filter: "sensors/#"}); err != nil {
		t.Fatal(err)
	}

	// What another bridge brings in goes out through this one; what this
	// bridge brings in does not.
	other := h.NewInjector("other", func(string) bool { return false })
	own := h.NewInjector("cloud", func(g string) bool { return g == n.String() })
	defer other.Close()
	defer own.Close()
	pub := func(in *Injector, topic string) {
		t.Helper()
		if err := in.Publish(&keyshared.Message{QoS: 1, Topic: topic, Payload: []byte(topic)}, false); err != nil {
			t.Fatal(err)
		}
	}
	pub(own, "sensors/own")
	pub(other, "sensors/1")
	m := recv(t, out.c)
	if m.Topic != "sensors/1" || m.QoS != 1 {
		t.Fatalf("delivered %+v, want sensors/1 at QoS 1 (sensors/own came in through this bridge)", m)
	}
	ig.Ack("bridge:cloud", m.Offset)

	gi, err := store.Group("workers/sensors/#")
	if err != nil || gi.Head != 2 {
		t.Fatalf("the client group holds %d messages (%v), want both", gi.Head, err)
	}
	list, err := h.Groups()
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range list {
		if st.Info.Name == n.String() {
			t.Fatalf("Groups lists the internal group %s", n)
		}
	}
	if len(list) != 1 {
		t.Fatalf("Groups lists %d groups, want the client group only", len(list))
	}
	var info persistence.GroupInfo
	if !poll.Within(10*time.Second, func() bool { // the store's view of the ack
		info, err = ig.Info()
		return err != nil || (info.Cursor == info.Head && info.Head == 1 && info.Members == 1)
	}) || err != nil {
		t.Fatalf("internal group %+v (%v): want one message, acked, and one member", info, err)
	}
}

func TestInjectorReportsARefusedAppend(t *testing.T) {
	h, _ := newInternalFixture(t, persistence.GroupConfig{MaxMessages: 1, Policy: persistence.PolicyReject})
	n := share.Name{Share: share.InternalPrefix + "bridge.b", Filter: "t/#"}
	if _, err := h.OpenInternal(n, &chanOut{c: make(chan keyshared.Message)}); err != nil {
		t.Fatal(err)
	}
	in := h.NewInjector("a", func(string) bool { return false })
	defer in.Close()
	m := &keyshared.Message{QoS: 1, Topic: "t/1"}
	if err := in.Publish(m, false); err != nil {
		t.Fatal(err)
	}
	if err := in.Publish(m, false); !errors.Is(err, persistence.ErrBacklogFull) {
		t.Fatalf("second publish into a full backlog: %v, want ErrBacklogFull", err)
	}
	if in.Refused.Load() != 1 {
		t.Fatalf("refused %d, want 1", in.Refused.Load())
	}
}

func TestAnOpenInternalGroupIsNotDeleted(t *testing.T) {
	h, _ := newInternalFixture(t, persistence.GroupConfig{})
	n := share.Name{Share: share.InternalPrefix + "bridge.x", Filter: "t/#"}
	ig, err := h.OpenInternal(n, &chanOut{c: make(chan keyshared.Message)})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.DeleteGroup(context.Background(), n.String()); !errors.Is(err, ErrGroupBusy) {
		t.Fatalf("deleting a bridge's open queue: %v, want ErrGroupBusy", err)
	}
	ig.Close() // the bridge is gone from the configuration: its queue may go
	if err := h.DeleteGroup(context.Background(), n.String()); err != nil {
		t.Fatal(err)
	}
}
