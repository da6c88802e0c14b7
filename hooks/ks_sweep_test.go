package hooks

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// sweepingBackend runs during between the backend's sweep deleting the idle
// groups and the hook stopping their dispatchers.
type sweepingBackend struct {
	keyshared.Backend
	during func()
}

func (b *sweepingBackend) SweepIdle(now time.Time, ttl time.Duration) ([]string, error) {
	swept, err := b.Backend.SweepIdle(now, ttl)
	if b.during != nil && len(swept) > 0 {
		b.during()
	}
	return swept, err
}

// A member that joins an idle group at the moment the sweeper deletes it
// joins the group made anew, and is dispatched to by the group that runs: never
// the dispatcher being stopped, its subscription granted and silent.
func TestJoinDuringIdleSweepGetsARunningGroup(t *testing.T) {
	server := mqtt.New(&mqtt.Options{InlineClient: true})
	db, err := persistence.Open(t.TempDir(), persistence.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	backend := &sweepingBackend{Backend: keyshared.NewLocalBackend(db.Groups())}
	h := NewKeyShared(server, backend, KeySharedConfig{
		KeyProperty: "key",
		GroupSettings: func(string) (keyshared.Config, persistence.GroupConfig) {
			return keyshared.DefaultConfig(), persistence.GroupConfig{}
		},
	})
	joinWaits := make(chan struct{}, 1)
	h.joinWaits = func() { joinWaits <- struct{}{} }
	if err := server.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := server.AddHook(h, nil); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := server.AddListener(listeners.NewNet("t", ln)); err != nil {
		t.Fatal(err)
	}
	if err := server.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = server.Close()
		_ = db.Close()
	})
	addr := ln.Addr().String()
	const group, filter = "jobs/a/#", "$share/jobs/a/#"

	// The group exists, its member gone, nothing held: idle.
	first := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "first", CleanStart: true, KeepAlive: 30})
	first.Subscribe(t, paho.SubscribeOptions{Topic: filter, QoS: 1})
	ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
	defer cancel()
	if _, err := first.Client.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{filter}}); err != nil {
		t.Fatal(err) // OnUnsubscribed has run when the UNSUBACK is sent
	}
	first.Close()

	// The second member subscribes while the sweep is deleting the group:
	// until its SUBACK, or until its join waits for the sweep.
	w := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "second", CleanStart: true, KeepAlive: 30})
	t.Cleanup(w.Close)
	subscribed := make(chan []byte, 1)
	backend.during = func() {
		backend.during = nil
		go func() {
			sa, err := w.Client.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
			if sa == nil {
				t.Errorf("subscribe: %v", err)
				subscribed <- nil
				return
			}
			subscribed <- sa.Reasons
		}()
		select {
		case <-joinWaits:
		case codes := <-subscribed:
			subscribed <- codes
		case <-time.After(mqtttest.Timeout):
			t.Error("the subscription neither granted nor waiting")
		}
	}
	swept, err := h.SweepIdle(context.Background(), time.Now().Add(time.Hour), time.Minute)
	if err != nil || len(swept) != 1 || swept[0] != group {
		t.Fatalf("swept %v, %v; want [%s]", swept, err, group)
	}
	if codes := <-subscribed; len(codes) != 1 || codes[0] != 1 {
		t.Fatalf("SUBACK %x, want [01]", codes)
	}
	if st, err := h.Group(group); err != nil || !st.Running || st.Info.Members != 1 {
		t.Fatalf("group after the sweep: %+v, %v; want running with the second member", st, err)
	}
	// The member is in the dispatcher that serves the group now.
	if g := h.groups.get(group); g == nil || len(g.d.Members()) != 1 || g.d.Members()[0].ID != "second" {
		t.Fatalf("running group %v: want it dispatching to the second member", g)
	}
}
