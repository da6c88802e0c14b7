package integration

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// keyedMember is an MQTT 5 group member that acknowledges by hand.
type keyedMember struct {
	*paho.Client
	mu   sync.Mutex
	got  []delivered
	more chan struct{} // signalled on every message
}

type delivered struct {
	key string
	seq int
	pb  *paho.Publish
}

func joinGroup(t *testing.T, addr, id, filter string) *keyedMember {
	t.Helper()
	m := &keyedMember{more: make(chan struct{}, 1)}
	conn := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
	m.Client = paho.NewClient(paho.ClientConfig{
		ClientID: id, Conn: conn, EnableManualAcknowledgment: true,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			key, seq, _ := strings.Cut(string(r.Packet.Payload), ":")
			n, _ := strconv.Atoi(seq)
			m.mu.Lock()
			m.got = append(m.got, delivered{key, n, r.Packet})
			m.mu.Unlock()
			select {
			case m.more <- struct{}{}:
			default:
			}
			return true, nil
		}},
	})
	ctx := t.Context()
	if _, err := m.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = m.Disconnect(&paho.Disconnect{})
		<-m.Done()
	})
	if _, err := m.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestKeySharedSurvivesBrokerSigkill publishes 20,000 QoS 1 messages over
// 500 keys into a group, lets the members acknowledge part of them, kills the
// broker with SIGKILL and restarts it: every unacknowledged message is
// delivered again, and each key's messages stay in order across the restart.
func TestKeySharedSurvivesBrokerSigkill(t *testing.T) {
	const keys, perKey, publishers = 500, 40, 10
	dataDir := t.TempDir()
	p := startKeyline(t, dataDir) // fsync on
	addr := p.addrs["tcp"]

	// Members first, so the group exists; they take part of the stream.
	a := joinGroup(t, addr, "worker-a", "$share/jobs/work/#")
	b := joinGroup(t, addr, "worker-b", "$share/jobs/work/#")

	// Each publisher owns keys k%publishers, so per-key publish order is defined.
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for pi := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pub, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: fmt.Sprintf("pub-%d", pi), CleanStart: true, KeepAlive: 30})
			if err != nil {
				errs <- err
				return
			}
			defer pub.Close()
			for s := range perKey {
				for k := pi; k < keys; k += publishers {
					key := fmt.Sprintf("key-%03d", k)
					_, err := pub.Client.Publish(t.Context(), &paho.Publish{Topic: "work/item", QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", key, s),
						Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
					if err != nil {
						errs <- fmt.Errorf("publisher %d: %w", pi, err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Acknowledge deliveries as they come until 3,000 are acknowledged, then stop.
	acked := map[string]int{} // key -> highest acknowledged seq
	ackedCount := 0
	next := map[*keyedMember]int{}
	for ackedCount < 3000 {
		for _, m := range []*keyedMember{a, b} {
			m.mu.Lock()
			for ; next[m] < len(m.got) && ackedCount < 3000; next[m]++ {
				d := m.got[next[m]]
				if err := m.Ack(d.pb); err != nil {
					t.Errorf("ack: %v", err)
				}
				acked[d.key] = d.seq
				ackedCount++
			}
			m.mu.Unlock()
		}
		if ackedCount < 3000 {
			select {
			case <-a.more:
			case <-b.more:
			case <-time.After(mqtttest.Timeout):
				t.Fatalf("stuck after acknowledging %d", ackedCount)
			}
		}
	}
	// The acknowledgements reach the broker before later packets on the same
	// connections; a round trip on each proves they were read.
	for _, m := range []*keyedMember{a, b} {
		if _, err := m.Subscribe(t.Context(), &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "sync/" + m.ClientID(), QoS: 0}}}); err != nil {
			t.Fatal(err)
		}
	}
	if code := p.signal(t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit %d, want killed", code)
	}
	t.Logf("acknowledged %d messages before SIGKILL", ackedCount)

	// Restart and drain with acknowledging members.
	p = startKeyline(t, dataDir)
	addr = p.addrs["tcp"]
	c := joinGroup(t, addr, "worker-c", "$share/jobs/work/#")
	d := joinGroup(t, addr, "worker-d", "$share/jobs/work/#")
	seen := map[string][]int{}
	ackAll := func(m *keyedMember, from int) int {
		m.mu.Lock()
		defer m.mu.Unlock()
		for _, x := range m.got[from:] {
			if err := m.Ack(x.pb); err != nil {
				t.Errorf("ack: %v", err)
			}
			seen[x.key] = append(seen[x.key], x.seq)
		}
		return len(m.got)
	}
	// Everything after each key's acknowledged prefix must come back.
	want := 0
	for k := range keys {
		key := fmt.Sprintf("key-%03d", k)
		if s, ok := acked[key]; ok {
			want += perKey - 1 - s
		} else {
			want += perKey
		}
	}
	cc, dc := 0, 0
	deadline := time.After(90 * time.Second)
	for {
		cc, dc = ackAll(c, cc), ackAll(d, dc)
		complete := true
		for k := range keys {
			key := fmt.Sprintf("key-%03d", k)
			s := seen[key]
			if len(s) == 0 || s[len(s)-1] != perKey-1 {
				complete = false
				break
			}
		}
		if complete {
			break
		}
		select {
		case <-c.more:
		case <-d.more:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("after restart: %d keys incomplete", keys-len(seen))
		}
	}
	redelivered := 0
	for k := range keys {
		key := fmt.Sprintf("key-%03d", k)
		s := seen[key]
		first := 0
		if a, ok := acked[key]; ok {
			first = a + 1 // at least everything after the acknowledged prefix
		}
		if s[0] > first {
			t.Fatalf("key %s resumed at %d after restart; %d..%d were never acknowledged", key, s[0], first, s[0]-1)
		}
		for i := 1; i < len(s); i++ {
			if s[i] != s[i-1]+1 {
				t.Fatalf("key %s out of order after restart: %v", key, s)
			}
		}
		redelivered += len(s)
	}
	t.Logf("after restart: %d deliveries for %d unacknowledged messages (%d acknowledged before the crash were delivered again)", redelivered, want, redelivered-want)
}
