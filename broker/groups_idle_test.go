package broker

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// dispatchLoops counts the goroutines running a group's dispatch loop.
func dispatchLoops() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "keyshared.(*Dispatcher).run(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// TestIdleGroupsAreReclaimed: a group whose members left and whose messages
// are all resolved is deleted after group-idle-ttl, and its dispatch loop
// ends with it; a group whose members left a message unacknowledged is
// never deleted, however long it stays idle.
func TestIdleGroupsAreReclaimed(t *testing.T) {
	cfg := testConfig(t)
	cfg.GroupIdleTTL = time.Second
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	loops := dispatchLoops()

	worker := connectMember(t, addr, "worker", "$share/done/a/#") // acknowledges what it gets
	silent, got := connectSilentMember(t, addr, "silent", "$share/held/b/#")
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	for _, m := range []*paho.Publish{keyed("a/1", "k", []byte("x")), keyed("b/1", "k", []byte("y"))} {
		if rc := pub.Publish(t, m); rc != 0 {
			t.Fatalf("publish %s: %#x", m.Topic, rc)
		}
	}
	worker.Next(t)
	select {
	case <-got:
	case <-time.After(mqtttest.Timeout):
		t.Fatal("the silent member got nothing")
	}
	if n := dispatchLoops(); n != loops+2 {
		t.Fatalf("%d dispatch loops with two groups, want %d", n, loops+2)
	}
	eventually(t, "done's message resolved", func() bool {
		st, err := b.keyShared.Group("done/a/#")
		return err == nil && st.Running && st.Stats.Backlog == 0
	})
	worker.Close()
	_ = silent.Disconnect(&paho.Disconnect{})
	<-silent.Done()

	eventually(t, "the idle group deleted by the sweeper", func() bool {
		_, err := b.keyShared.Group("done/a/#")
		return err != nil
	})
	// Group reports a swept group gone once its dispatcher has stopped; its
	// goroutine exits just after (goleak polls for the same reason).
	eventually(t, "the idle group's dispatch loop ended", func() bool { return dispatchLoops() == loops+1 })
	// However idle: a group holding a message is never swept.
	swept, err := b.keyShared.SweepIdle(context.Background(), time.Now().Add(30*24*time.Hour), time.Second)
	if err != nil || len(swept) != 0 {
		t.Fatalf("swept %v, %v: a group holding a message must stay", swept, err)
	}
	if st, err := b.keyShared.Group("held/b/#"); err != nil || st.Info.Backlog != 1 {
		t.Fatalf("held group: %+v, %v", st.Info, err)
	}
}
