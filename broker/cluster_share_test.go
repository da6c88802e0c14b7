package broker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// TestClusterSharedSubscriptionFollowsSession: a persistent session's
// Key-Shared membership, with its key filters, comes back with the session
// when it resumes on another node, as it does on one node after a restart
// (TestKeyFiltersOfAPersistentMemberSurviveARestart).
func TestClusterSharedSubscriptionFollowsSession(t *testing.T) {
	nc := natstest.Start(t, 1)
	bs := startClusterBrokers(t, 2, nc.URLs())
	a, b := bs[0], bs[1]
	opts := mqtttest.WorkerOptions{SessionExpiry: 300, KeepAlive: 30}
	w1, err := mqtttest.DialWorker(a.Addr("tcp"), "w1", opts)
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := w1.Subscribe("$share/kf/jobs/#", 1, "a*"); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	_ = w1.Disconnect()
	w1.Close()

	opts.CleanStart = false
	w1, err = mqtttest.DialWorker(b.Addr("tcp"), "w1", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w1.Close)
	if !w1.Connack().SessionPresent {
		t.Fatal("session not present on node b")
	}
	w2, err := mqtttest.DialWorker(b.Addr("tcp"), "w2", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w2.Close)
	if rc, err := w2.Subscribe("$share/kf/jobs/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	view := func() string {
		var v adminapi.GroupView
		apiJSON(t, "GET", "http://"+b.Addr("http")+adminapi.PathGroupDetail+"?group=kf%2Fjobs%2F%23", "", 200, &v)
		return fmt.Sprintf("holder %q, members %+v", v.Holder, v.PerMember)
	}
	if !mqtttest.Within(15*time.Second, func() bool {
		st, err := b.keyShared.Group("kf/jobs/#")
		if err != nil || st.Holder == "" || st.Stats.Members != 2 {
			return false
		}
		for _, m := range st.Stats.PerMember {
			if !m.Active {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("both members not active in the group: %s", view())
	}
	pub := dialV5(t, a, &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	const perPrefix = 20
	for i := range perPrefix {
		for _, prefix := range []string{"a", "b"} {
			key := fmt.Sprintf("%s%02d", prefix, i)
			pub.Publish(t, &paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte(key),
				Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
		}
	}
	got := map[string]int{}
	for got["w1"]+got["w2"] < 2*perPrefix {
		select {
		case m := <-w1.Messages():
			if !strings.HasPrefix(m.Key, "a") {
				t.Fatalf("w1 (key filter a*) got key %s after resuming on node b", m.Key)
			}
			got["w1"]++
			_ = w1.Ack(m)
		case m := <-w2.Messages():
			got["w2"]++
			_ = w2.Ack(m)
		case <-time.After(mqtttest.Timeout):
			t.Fatalf("stalled after %v", got)
		}
	}
	if got["w1"] == 0 {
		t.Fatalf("the member resumed on node b got nothing: %v; %s", got, view())
	}
	t.Logf("deliveries: %v", got)

	// Unsubscribed, the membership is gone from the record too: resumed
	// on node a, the session is no member.
	if rc, err := w1.Unsubscribe("$share/kf/jobs/#"); err != nil || rc != 0 {
		t.Fatalf("unsubscribe: %#x %v", rc, err)
	}
	_ = w1.Disconnect()
	w1, err = mqtttest.DialWorker(a.Addr("tcp"), "w1", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w1.Close)
	if !w1.Connack().SessionPresent {
		t.Fatal("session not present on node a")
	}
	if rc, err := w1.Subscribe("sync/w1", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	waitFor(t, 15*time.Second, "w1 settled on node a", func() bool {
		_, ok := a.server.Clients.Get("w1")
		return ok
	})
	for i := range perPrefix {
		key := fmt.Sprintf("a%02d", i)
		pub.Publish(t, &paho.Publish{Topic: "jobs/x", QoS: 1, Payload: []byte(key),
			Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
	}
	for range perPrefix {
		m := w2.Next(mqtttest.Timeout)
		if m == nil {
			t.Fatalf("w2 stalled; %s", view())
		}
		_ = w2.Ack(m)
	}
	pub.Publish(t, &paho.Publish{Topic: "sync/w1", QoS: 1, Payload: []byte("sentinel")})
	if m := w1.Next(mqtttest.Timeout); m == nil || string(m.Payload) != "sentinel" {
		t.Fatalf("w1 got %+v, want only the sentinel (it left the group); %s", m, view())
	}
}
