package integration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/internal/poll"
)

// rollingNode is a cluster node that can be stopped and started again on the
// same port and data dir, as a rolling restart does.
type rollingNode struct {
	id, addr, dataDir string
	args              []string
	p                 *proc
}

func (n *rollingNode) start(t *testing.T) {
	t.Helper()
	n.p = startKeyline(t, n.dataDir, append([]string{"--tcp", n.addr}, n.args...)...)
}

// mover is an MQTT 5 client with a persistent session that follows the
// cluster: when its connection ends it goes where the DISCONNECT's Server
// Reference says, else to the next node, and records how long it was
// without a broker.
type mover struct {
	t      *testing.T
	id     string
	addrs  []string
	filter string // subscribed on every (re)connection; "" for none
	onMsg  func(*paho.Publish)

	mu     sync.Mutex
	client *paho.Client
	next   int    // index into addrs of the node to try next
	ref    string // the last Server Reference received
	gaps   []time.Duration
	// lost gets the client of each connection that ends, one the mover
	// uses or one of a dial that failed after its CONNECT (follow skips
	// those: waiting for the current connection's end would hang).
	lost chan *paho.Client
}

func newMover(t *testing.T, id string, addrs []string, first int, filter string, onMsg func(*paho.Publish)) *mover {
	m := &mover{t: t, id: id, addrs: addrs, next: first, filter: filter, onMsg: onMsg, lost: make(chan *paho.Client, 16)}
	if err := m.connect(context.Background()); err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	return m
}

// connect tries the referenced server, then each node in turn, until one
// takes the session.
func (m *mover) connect(ctx context.Context) error {
	m.mu.Lock()
	ref := m.ref
	m.ref = ""
	m.mu.Unlock()
	var errs []error
	for attempt := 0; attempt < 3*len(m.addrs)+1; attempt++ {
		addr := ref
		if addr == "" || attempt > 0 {
			m.mu.Lock()
			addr = m.addrs[m.next%len(m.addrs)]
			m.next++
			m.mu.Unlock()
		}
		if err := m.dial(ctx, addr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
			if ctx.Err() != nil {
				break
			}
			// A node that is restarting refuses connections for a moment:
			// a short wall-clock pause between rounds, as clients back off.
			if attempt%len(m.addrs) == len(m.addrs)-1 {
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		return nil
	}
	return errors.Join(errs...)
}

func (m *mover) dial(ctx context.Context, addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	var (
		once sync.Once
		c    *paho.Client
	)
	ended := func() {
		once.Do(func() {
			select {
			case m.lost <- c:
			default:
			}
		})
	}
	c = paho.NewClient(paho.ClientConfig{ClientID: m.id, Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			if m.onMsg != nil {
				m.onMsg(r.Packet)
			}
			return true, nil
		}},
		OnServerDisconnect: func(d *paho.Disconnect) {
			if d.Properties != nil && d.Properties.ServerReference != "" {
				m.mu.Lock()
				m.ref = d.Properties.ServerReference
				m.mu.Unlock()
			}
			ended()
		},
		OnClientError: func(error) { ended() },
	})
	expiry := uint32(3600)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ca, err := c.Connect(cctx, &paho.Connect{ClientID: m.id, KeepAlive: 30, CleanStart: false,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})
	if err != nil {
		_ = conn.Close()
		return err
	}
	if ca.ReasonCode != 0 {
		_ = conn.Close()
		return fmt.Errorf("CONNACK %#x", ca.ReasonCode)
	}
	if m.filter != "" {
		if _, err := c.Subscribe(cctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: m.filter, QoS: 1}}}); err != nil {
			_ = c.Disconnect(&paho.Disconnect{})
			return err
		}
	}
	m.mu.Lock()
	m.client = c
	m.mu.Unlock()
	return nil
}

// follow reconnects each time the connection ends, until stop.
func (m *mover) follow(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		select {
		case <-stop:
			return
		case ended := <-m.lost:
			m.mu.Lock()
			current := ended == m.client
			m.mu.Unlock()
			if !current {
				continue // a dial that failed after its CONNECT
			}
			<-ended.Done()
		}
		lostAt := time.Now()
		if err := m.connect(context.Background()); err != nil {
			m.t.Errorf("%s: no node took the session: %v", m.id, err)
			return
		}
		m.mu.Lock()
		m.gaps = append(m.gaps, time.Since(lostAt))
		m.mu.Unlock()
	}
}

func (m *mover) publish(ctx context.Context, p *paho.Publish) error {
	m.mu.Lock()
	c := m.client
	m.mu.Unlock()
	res, err := c.Publish(ctx, p)
	if err != nil {
		return err
	}
	if res.ReasonCode >= 0x80 {
		return fmt.Errorf("PUBACK %#x", res.ReasonCode)
	}
	return nil
}

func (m *mover) close() {
	m.mu.Lock()
	c := m.client
	m.mu.Unlock()
	if c == nil {
		return
	}
	_ = c.Disconnect(&paho.Disconnect{})
	<-c.Done()
}

func (m *mover) longestGap() (time.Duration, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var longest time.Duration
	for _, g := range m.gaps {
		longest = max(longest, g)
	}
	return longest, len(m.gaps)
}

// keyOrder records, per key, the first arrival of each message number.
type keyOrder struct {
	mu    sync.Mutex
	seen  map[int]bool
	byKey map[string][]int
	dups  int
}

func (k *keyOrder) add(p *paho.Publish) {
	s := string(p.Payload)
	i := strings.LastIndexByte(s, '-')
	n, err := strconv.Atoi(s[i+1:])
	if err != nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.seen[n] {
		k.dups++
		return
	}
	k.seen[n] = true
	k.byKey[s[:i]] = append(k.byKey[s[:i]], n)
}

// missing returns the numbers below total that have not arrived.
func (k *keyOrder) missing(total int) []int {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []int
	for i := range total {
		if !k.seen[i] {
			out = append(out, i)
		}
	}
	return out
}

// TestClusterRollingRestart restarts each node of a 3-node cluster in turn
// (SIGTERM, then the same binary on the same port and data dir) while a
// publisher sends QoS 1 messages on 8 keys to an ordinary persistent
// subscriber and to a Key-Shared group of two members. Each node sends its
// clients to the next one (server-reference, DISCONNECT 0x9C); clients follow.
// Every acknowledged message reaches the subscriber and the group, each key's
// messages in order, and the test reports how long clients were without a
// broker.
func TestClusterRollingRestart(t *testing.T) {
	nc := natstest.Start(t, 3)
	urls := strings.Join(nc.URLs(), ",")
	nodes := make([]*rollingNode, 3)
	addrs := make([]string, 3)
	for i := range nodes {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", natstest.FreePort(t))
	}
	for i := range nodes {
		nodes[i] = &rollingNode{id: fmt.Sprintf("node-%d", i), addr: addrs[i], dataDir: t.TempDir(),
			args: []string{"--nats", urls, "--node-id", fmt.Sprintf("node-%d", i), "--server-reference", addrs[(i+1)%3]}}
	}
	for _, n := range nodes {
		n.start(t)
	}

	sub, group := newReceiver(), &keyOrder{seen: map[int]bool{}, byKey: map[string][]int{}}
	movers := []*mover{
		newMover(t, "roll-sub", addrs, 0, "roll/#", func(p *paho.Publish) { sub.add(string(p.Payload)) }),
		newMover(t, "roll-worker-1", addrs, 1, "$share/rollers/roll/#", group.add),
		newMover(t, "roll-worker-2", addrs, 2, "$share/rollers/roll/#", group.add),
	}
	pub := newMover(t, "roll-pub", addrs, 1, "", nil)
	movers = append(movers, pub)
	stop := make(chan struct{})
	var follow sync.WaitGroup
	for _, m := range movers {
		follow.Add(1)
		go m.follow(stop, &follow)
	}

	// The publisher sends message i until it is acknowledged, then i+1.
	var (
		published = make(chan int, 1)
		pubDone   = make(chan struct{})
		pubStop   = make(chan struct{})
		retries   int
	)
	go func() {
		defer close(pubDone)
		for i := 0; ; i++ {
			select {
			case <-pubStop:
				return
			default:
			}
			p := &paho.Publish{Topic: fmt.Sprintf("roll/k%d", i%8), QoS: 1, Payload: fmt.Appendf(nil, "k%d-%d", i%8, i)}
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := pub.publish(ctx, p)
				cancel()
				if err == nil {
					break
				}
				retries++
				select {
				case <-pubStop:
					return
				case <-time.After(20 * time.Millisecond): // polling for the mover's next connection
				}
			}
			select {
			case <-published:
			default:
			}
			published <- i
		}
	}()
	// waitFor waits until the publisher has had n more messages acknowledged.
	lastAcked := -1
	waitFor := func(n int) {
		t.Helper()
		deadline := time.After(60 * time.Second)
		target := lastAcked + n
		for lastAcked < target {
			select {
			case lastAcked = <-published:
			case <-deadline:
				t.Fatalf("publisher stuck at message %d, waiting for %d", lastAcked, target)
			}
		}
	}

	waitFor(200)
	for _, n := range nodes {
		start := time.Now()
		if code := n.p.signal(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("%s exited %d on SIGTERM\n%s", n.id, code, n.p.Logs())
		}
		stopped := time.Since(start)
		n.start(t)
		t.Logf("%s: stopped in %v, back in %v", n.id, stopped.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		waitFor(200)
	}
	close(pubStop)
	<-pubDone
	total := lastAcked + 1

	acked := make([]int, total)
	for i := range acked {
		acked[i] = i
	}
	sub.check(t, "roll-sub", acked)
	// Every acknowledged message, not just as many: the publisher went on
	// past total, and a message requeued after a restart may come last.
	poll.Within(30*time.Second, func() bool { return len(group.missing(total)) == 0 }) // what is missing is reported below
	missing := group.missing(total)
	group.mu.Lock()
	for key, ns := range group.byKey {
		for i := 1; i < len(ns); i++ {
			if ns[i] < ns[i-1] {
				t.Errorf("group: key %s message %d first arrived after %d", key, ns[i], ns[i-1])
			}
		}
	}
	dups := group.dups
	group.mu.Unlock()
	if len(missing) > 0 {
		t.Errorf("group: %d of %d acknowledged messages never arrived: %v", len(missing), total, missing)
	}
	close(stop)
	follow.Wait()
	for _, m := range movers {
		longest, n := m.longestGap()
		t.Logf("%s: %d reconnections, longest without a broker %v", m.id, n, longest.Round(time.Millisecond))
		m.close()
	}
	t.Logf("rolling restart: %d messages acknowledged (%d publish retries), group duplicates %d", total, retries, dups)
}
