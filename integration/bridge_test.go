package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
	"github.com/keyline-mq/keyline/internal/poll"
)

// mosq is Debian's mosquitto run as a child on a loopback port of its own,
// with a generated config; it keeps its port across restarts.
type mosq struct {
	port int
	dir  string
	conf string
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	logs strings.Builder
}

// needMosquitto returns the path of the mosquitto broker. Under CI its
// absence fails the test; elsewhere it skips.
func needMosquitto(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/mosquitto"); serr == nil {
			return "/usr/sbin/mosquitto"
		}
		msg := "mosquitto not found: install Debian's mosquitto (.ci/run does)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}

// startMosquitto starts mosquitto with persistence (sessions and queued
// messages survive a graceful restart) plus the extra config lines, and
// stops it when the test ends.
func startMosquitto(t testing.TB, extra string) *mosq {
	t.Helper()
	m := &mosq{port: natstest.FreePort(t), dir: t.TempDir()}
	m.conf = filepath.Join(m.dir, "mosquitto.conf")
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	// user: mosquitto started as root drops to user mosquitto, which may not
	// write the test's directory.
	conf := fmt.Sprintf(`listener %d 127.0.0.1
user %s
allow_anonymous true
persistence true
persistence_location %s/
max_queued_messages 0
max_inflight_messages 0
log_dest stderr
log_type error
log_type warning
log_type notice
%s
`, m.port, me.Username, m.dir, extra)
	if err := os.WriteFile(m.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	m.start(t)
	t.Cleanup(func() {
		if m.cmd != nil && m.cmd.ProcessState == nil {
			_ = m.cmd.Process.Kill()
			<-m.done
		}
		if t.Failed() {
			t.Logf("mosquitto logs:\n%s", m.Logs())
		}
	})
	return m
}

func (m *mosq) Logs() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.logs.String()
}

func (m *mosq) addr() string { return fmt.Sprintf("127.0.0.1:%d", m.port) }

// start (re)starts the broker and waits until it accepts connections.
func (m *mosq) start(t testing.TB) {
	t.Helper()
	m.cmd = exec.Command(needMosquitto(t), "-c", m.conf)
	stderr, err := m.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.done = make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			m.mu.Lock()
			m.logs.WriteString(sc.Text() + "\n")
			m.mu.Unlock()
		}
		_ = m.cmd.Wait()
		close(m.done)
	}()
	waitListening(t, m.addr(), m.done)
}

// stop signals the broker (SIGTERM: it saves its sessions) and waits for it.
func (m *mosq) stop(t testing.TB, sig syscall.Signal) {
	t.Helper()
	_ = m.cmd.Process.Signal(sig)
	select {
	case <-m.done:
	case <-time.After(2 * mqtttest.Timeout):
		t.Fatalf("mosquitto still running %v after %v", 2*mqtttest.Timeout, sig)
	}
}

// waitListening polls addr until it accepts a TCP connection.
func waitListening(t testing.TB, addr string, exited <-chan struct{}) {
	t.Helper()
	var err error
	gone := false
	if poll.Within(mqtttest.Timeout, func() bool { // the child's listener
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return true
		}
		select {
		case <-exited:
			gone = true
		default:
		}
		return gone
	}) && !gone {
		return
	}
	if gone {
		t.Fatalf("broker on %s exited before it listened", addr)
	}
	t.Fatalf("nothing listens on %s after %v: %v", addr, mqtttest.Timeout, err)
}

// bridgeStatus reads one bridge's view from a keyline's admin API.
func bridgeStatus(t testing.TB, p *proc, name string) adminapi.BridgeView {
	t.Helper()
	resp, err := http.Get("http://" + p.addrs["http"] + adminapi.PathBridges + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v adminapi.BridgeView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET bridge %s: %d %v", name, resp.StatusCode, err)
	}
	return v
}

// waitBridge polls a bridge's view until ok holds.
func waitBridge(t testing.TB, p *proc, name, what string, timeout time.Duration, ok func(adminapi.BridgeView) bool) adminapi.BridgeView {
	t.Helper()
	var v adminapi.BridgeView
	if !poll.Within(timeout, func() bool { v = bridgeStatus(t, p, name); return ok(v) }) { // the admin API
		t.Fatalf("bridge %s not %s within %v: %+v", name, what, timeout, v)
	}
	return v
}

func bridgeUp(v adminapi.BridgeView) bool { return v.State == "connected" && v.Subscribed }

// bridgeFlag is a --bridge value with quick reconnections for tests.
func bridgeFlag(name, addr, protocol string, topics ...string) string {
	s := fmt.Sprintf("name=%s address=%s client-id=edge-%s protocol=%s reconnect-backoff=50ms,500ms keep-alive=5s", name, addr, name, protocol)
	for _, t := range topics {
		s += " topic=" + strconv.Quote(t)
	}
	return s
}

func TestBridgeToMosquittoBothWays(t *testing.T) {
	central := startMosquitto(t, "")
	for _, proto := range []string{"3.1.1", "5"} {
		t.Run("v"+proto, func(t *testing.T) {
			edge := startKeyline(t, t.TempDir(), "--bridge", bridgeFlag("central", central.addr(), proto,
				`sensors/# out 2 "" site1/`, `cmd/# in 2 "" site1/`))
			waitBridge(t, edge, "central", "connected", mqtttest.Timeout, bridgeUp)

			cid := "v" + strings.ReplaceAll(proto, ".", "")
			rsub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, central.addr(), nil), &paho.Connect{ClientID: "central-sub-" + cid, CleanStart: true, KeepAlive: 30})
			rsub.Subscribe(t, paho.SubscribeOptions{Topic: "site1/sensors/#", QoS: 2})
			esub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, edge.addrs["tcp"], nil), &paho.Connect{ClientID: "device-sub", CleanStart: true, KeepAlive: 30})
			esub.Subscribe(t, paho.SubscribeOptions{Topic: "cmd/#", QoS: 2})
			rpub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, central.addr(), nil), &paho.Connect{ClientID: "central-pub-" + cid, CleanStart: true, KeepAlive: 30})
			epub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, edge.addrs["tcp"]), "device-pub", true, nil)

			for qos := byte(0); qos <= 2; qos++ {
				for i := range 5 {
					epub.Publish(t, fmt.Sprintf("sensors/q%d", qos), qos, false, fmt.Appendf(nil, "up-%d-%d", qos, i))
				}
				for i := range 5 {
					m := rsub.Next(t)
					if want := fmt.Sprintf("up-%d-%d", qos, i); string(m.Payload) != want || m.Topic != fmt.Sprintf("site1/sensors/q%d", qos) || m.QoS != qos {
						t.Fatalf("mosquitto got %s %q QoS %d, want site1/sensors/q%d %q QoS %d", m.Topic, m.Payload, m.QoS, qos, want, qos)
					}
				}
				for i := range 5 {
					rpub.Publish(t, &paho.Publish{Topic: fmt.Sprintf("site1/cmd/q%d", qos), QoS: qos, Payload: fmt.Appendf(nil, "down-%d-%d", qos, i)})
				}
				for i := range 5 {
					m := esub.Next(t)
					if want := fmt.Sprintf("down-%d-%d", qos, i); string(m.Payload) != want || m.Topic != fmt.Sprintf("cmd/q%d", qos) || m.QoS != qos {
						t.Fatalf("keyline got %s %q QoS %d, want cmd/q%d %q QoS %d", m.Topic, m.Payload, m.QoS, qos, want, qos)
					}
				}
			}
			v := waitBridge(t, edge, "central", "done", mqtttest.Timeout, func(v adminapi.BridgeView) bool { return v.Sent == 15 && v.Received == 15 })
			if v.QueuedMessages != 0 || v.InFlight != 0 || v.Dropped != 0 {
				t.Fatalf("bridge after the exchange: %+v", v)
			}
		})
	}
}

// seqCollector collects "key:seq" payloads and checks, per key, that the
// first arrival of every seq comes in order (a resend may repeat seqs).
type seqCollector struct {
	mu    sync.Mutex
	seen  map[string]map[int]bool
	last  map[string]int
	dups  int
	order []string // order violations
	n     int
	ch    chan struct{} // signalled on every new message
}

func newSeqCollector() *seqCollector {
	return &seqCollector{seen: map[string]map[int]bool{}, last: map[string]int{}, ch: make(chan struct{}, 1)}
}

func (c *seqCollector) add(payload string) {
	key, s, ok := strings.Cut(payload, ":")
	seq, err := strconv.Atoi(s)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ok || err != nil {
		c.order = append(c.order, "bad payload "+payload)
		return
	}
	if c.seen[key] == nil {
		c.seen[key] = map[int]bool{}
		c.last[key] = -1
	}
	if c.seen[key][seq] {
		c.dups++
		return
	}
	c.seen[key][seq] = true
	if seq < c.last[key] && len(c.order) < 10 {
		c.order = append(c.order, fmt.Sprintf("key %s: %d after %d", key, seq, c.last[key]))
	}
	c.last[key] = max(c.last[key], seq)
	c.n++
	select {
	case c.ch <- struct{}{}:
	default:
	}
}

// wait waits until n distinct messages arrived.
func (c *seqCollector) wait(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		got := c.n
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-c.ch:
		case <-deadline.C:
			t.Fatalf("%d of %d messages arrived within %v", got, n, timeout)
		}
	}
}

// verify fails the test unless every message "k<key>:<seq>" of keys keys
// and perKey seqs arrived, each key's in order.
func (c *seqCollector) verify(t testing.TB, keys, perKey int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var missing []string
	for k := range keys {
		for s := range perKey {
			if !c.seen[fmt.Sprintf("k%d", k)][s] && len(missing) < 10 {
				missing = append(missing, fmt.Sprintf("k%d:%d", k, s))
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("missing %v", missing)
	}
	if len(c.order) > 0 {
		t.Fatalf("order broken: %v", c.order)
	}
}

// v3Collector is a persistent MQTT 3.1.1 session on addr subscribed to
// filter at QoS 1 that reconnects by itself (the broker restarts).
func v3Collector(t testing.TB, addr, id, filter string, c *seqCollector) {
	t.Helper()
	o := mqtt3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetCleanSession(false).
		SetAutoReconnect(true).SetConnectRetry(true).SetConnectRetryInterval(50 * time.Millisecond).
		SetMaxReconnectInterval(200 * time.Millisecond).SetOrderMatters(true).SetConnectTimeout(mqtttest.Timeout).
		SetDefaultPublishHandler(func(_ mqtt3.Client, m mqtt3.Message) { c.add(string(m.Payload())) })
	cl := mqtt3.NewClient(o)
	if tok := cl.Connect(); !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
		t.Fatalf("collector connect: %v", tok.Error())
	}
	if tok := cl.Subscribe(filter, 1, nil); !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
		t.Fatalf("collector subscribe: %v", tok.Error())
	}
	t.Cleanup(func() { cl.Disconnect(0) })
}

// remoteBroker is a broker a bridge connects to, that a test can stop and
// start again on the same address.
type remoteBroker interface {
	addr() string
	down(t *testing.T)
	up(t *testing.T)
}

func (m *mosq) down(t *testing.T) { m.stop(t, syscall.SIGTERM) }
func (m *mosq) up(t *testing.T)   { m.start(t) }

// keylineRemote is a keyline binary on a fixed port and data dir, killed
// with SIGKILL and started again.
type keylineRemote struct {
	port int
	dir  string
	p    *proc
}

func startKeylineRemote(t *testing.T) *keylineRemote {
	k := &keylineRemote{port: natstest.FreePort(t), dir: t.TempDir()}
	k.up(t)
	return k
}

func (k *keylineRemote) addr() string { return fmt.Sprintf("127.0.0.1:%d", k.port) }
func (k *keylineRemote) down(t *testing.T) {
	k.p.signal(t, syscall.SIGKILL)
}
func (k *keylineRemote) up(t *testing.T) {
	k.p = startKeyline(t, k.dir, "--tcp", k.addr(), "--fsync=false")
}

// publishPerKey publishes messages from to to-1 at QoS 1: message i is
// "k<i%keys>:<i/keys>" on prefix/k<i%keys>, with up to window
// acknowledgements outstanding; at(i) runs before message i. It returns once
// all are acknowledged.
func publishPerKey(t *testing.T, pub *mqtttest.V3, prefix string, keys, from, to, window int, at func(i int)) {
	t.Helper()
	var toks []mqtt3.Token
	for i := from; i < to; i++ {
		if at != nil {
			at(i)
		}
		k := i % keys
		toks = append(toks, pub.Client.Publish(fmt.Sprintf("%s/k%d", prefix, k), 1, false, fmt.Sprintf("k%d:%d", k, i/keys)))
		if len(toks) >= window {
			if tok := toks[0]; !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
				t.Fatalf("publish: %v", tok.Error())
			}
			toks = toks[1:]
		}
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(mqtttest.Timeout) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
}

// TestBridgeRemoteRestartUnderLoad stops the remote while a publisher pumps
// QoS 1 messages into the bridging keyline and starts it again: every
// message arrives, and each key's messages in order.
func TestBridgeRemoteRestartUnderLoad(t *testing.T) {
	const keys, perKey = 10, 300
	for _, tc := range []struct {
		name   string
		remote func(t *testing.T) remoteBroker
		rule   string
	}{
		{"mosquitto/pipelined", func(t *testing.T) remoteBroker { return startMosquitto(t, "") }, `sensors/# out 1 "" site/`},
		{"mosquitto/ordered", func(t *testing.T) remoteBroker { return startMosquitto(t, "") }, `sensors/# out 1 "" site/ ordered`},
		{"keyline/pipelined", func(t *testing.T) remoteBroker { return startKeylineRemote(t) }, `sensors/# out 1 "" site/`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			central := tc.remote(t)
			got := newSeqCollector()
			v3Collector(t, central.addr(), "collector", "site/sensors/#", got)
			edge := startKeyline(t, t.TempDir(), "--bridge", bridgeFlag("central", central.addr(), "5", tc.rule))
			waitBridge(t, edge, "central", "connected", mqtttest.Timeout, bridgeUp)
			pub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, edge.addrs["tcp"]), "device", true, nil)
			n := keys * perKey
			publishPerKey(t, pub, "sensors", keys, 0, n, 50, func(i int) {
				switch i {
				case n / 3:
					central.down(t)
				case 2 * n / 3:
					v := bridgeStatus(t, edge, "central")
					if v.State == "connected" || v.QueuedMessages == 0 {
						t.Errorf("remote down: bridge %s with %d queued, want disconnected with a backlog", v.State, v.QueuedMessages)
					}
					central.up(t)
				}
			})
			got.wait(t, n, 3*mqtttest.Timeout)
			got.verify(t, keys, perKey)
			v := waitBridge(t, edge, "central", "drained", mqtttest.Timeout, func(v adminapi.BridgeView) bool { return v.QueuedMessages == 0 && v.InFlight == 0 })
			t.Logf("%d messages, %d duplicates; bridge: %d sent, %d connects, %d failed attempts", n, got.dups, v.Sent, v.Connects, v.Failures)
		})
	}
}

// TestBridgeSigkillLosesNothingAcknowledged kills the bridging keyline
// (SIGKILL) while it forwards, and again while the remote is down and the
// bridge's log holds a backlog: every message the keyline acknowledged to
// its publisher reaches the remote, each key in order.
func TestBridgeSigkillLosesNothingAcknowledged(t *testing.T) {
	const keys, perKey = 10, 300
	central := startMosquitto(t, "")
	got := newSeqCollector()
	v3Collector(t, central.addr(), "collector", "site/sensors/#", got)
	dir := t.TempDir()
	flag := bridgeFlag("central", central.addr(), "5", `sensors/# out 1 "" site/ ordered`)
	n := keys * perKey
	edge := startKeyline(t, dir, "--bridge", flag)
	waitBridge(t, edge, "central", "connected", mqtttest.Timeout, bridgeUp)
	phase := func(from, to int) {
		pub := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, edge.addrs["tcp"]), "device", true, nil)
		publishPerKey(t, pub, "sensors", keys, from, to, 50, nil)
		pub.Disconnect(0)
	}
	// 1: killed right after its publisher's last PUBACK, mid-forwarding.
	phase(0, n/3)
	edge.signal(t, syscall.SIGKILL)
	edge = startKeyline(t, dir, "--bridge", flag)
	// 2: the remote down; the backlog sits in the log when the kill comes.
	central.down(t)
	phase(n/3, 2*n/3)
	v := waitBridge(t, edge, "central", "holding the backlog", mqtttest.Timeout, func(v adminapi.BridgeView) bool { return v.QueuedMessages > 0 })
	t.Logf("killed with %d messages queued", v.QueuedMessages)
	edge.signal(t, syscall.SIGKILL)
	edge = startKeyline(t, dir, "--bridge", flag)
	central.up(t)
	// 3: everything flows again.
	phase(2*n/3, n)
	got.wait(t, n, 3*mqtttest.Timeout)
	got.verify(t, keys, perKey)
	t.Logf("%d messages, %d duplicates", n, got.dups)
}

// countingSub counts the copies of each payload a subscriber receives.
type countingSub struct {
	mu     sync.Mutex
	copies map[string]int
	total  int
}

func newCountingSub(t *testing.T, addr, id, filter string) *countingSub {
	t.Helper()
	c := &countingSub{copies: map[string]int{}}
	conn := mqtttest.Dial(t, mqtttest.TCP, addr, nil)
	cl := paho.NewClient(paho.ClientConfig{ClientID: id, Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			c.mu.Lock()
			c.copies[string(r.Packet.Payload)]++
			c.total++
			c.mu.Unlock()
			return true, nil
		}}})
	ctx, cancel := contextTimeout()
	defer cancel()
	if _, err := cl.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cl.Disconnect(&paho.Disconnect{})
		<-cl.Done()
	})
	return c
}

func (c *countingSub) counts() (total int, per map[int]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	per = map[int]int{}
	for _, n := range c.copies {
		per[n]++
	}
	return c.total, per
}

// TestBridgeLoopDoesNotAmplify bridges two keylines on loop/# both ways and
// publishes on one: every message reaches each broker's subscribers a
// bounded number of times, and the traffic stops.
func TestBridgeLoopDoesNotAmplify(t *testing.T) {
	const m = 200
	for _, tc := range []struct {
		name         string
		proto        string
		twoBridges   bool
		wantA, wantB int // copies of each message at a subscriber on A, on B
	}{
		// No Local keeps B from sending A's bridge its own messages back.
		{"v5/one-bridge", "5", false, 1, 1},
		// The via mark stops the second round: B's bridge sends A's message
		// back to A, which does not send it out again; each inbound copy is
		// published once more (A: its own, B's bridge's, and A's bridge's
		// inbound copy of what B's bridge took in).
		{"v5/two-bridges", "5", true, 3, 2},
		// 3.1.1 has no No Local: B takes try_private's mark as mosquitto
		// does, and gives the bridge's subscriptions No Local.
		{"v3/one-bridge", "3.1.1", false, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			portA, portB := natstest.FreePort(t), natstest.FreePort(t)
			addrA, addrB := fmt.Sprintf("127.0.0.1:%d", portA), fmt.Sprintf("127.0.0.1:%d", portB)
			argsB := []string{"--tcp", addrB}
			if tc.twoBridges {
				argsB = append(argsB, "--bridge", bridgeFlag("toA", addrA, tc.proto, "loop/# both 1"))
			}
			b := startKeyline(t, t.TempDir(), argsB...)
			a := startKeyline(t, t.TempDir(), "--tcp", addrA, "--bridge", bridgeFlag("toB", addrB, tc.proto, "loop/# both 1"))
			waitBridge(t, a, "toB", "connected", mqtttest.Timeout, bridgeUp)
			if tc.twoBridges {
				waitBridge(t, b, "toA", "connected", mqtttest.Timeout, bridgeUp)
			}
			subA, subB := newCountingSub(t, addrA, "subA", "loop/#"), newCountingSub(t, addrB, "subB", "loop/#")
			pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addrA, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
			for i := range m {
				pub.Publish(t, &paho.Publish{Topic: "loop/x", QoS: 1, Payload: fmt.Appendf(nil, "m%d", i)})
			}
			// Wait for the expected copies, then for every bridge to have
			// nothing queued or in flight: from then on nothing can come.
			var ta, tb int
			if !poll.Within(3*mqtttest.Timeout, func() bool { // the subscribers' counts
				ta, _ = subA.counts()
				tb, _ = subB.counts()
				return ta >= tc.wantA*m && tb >= tc.wantB*m
			}) {
				t.Fatalf("copies: A %d, B %d; want %d and %d", ta, tb, tc.wantA*m, tc.wantB*m)
			}
			idle := func(v adminapi.BridgeView) bool { return v.QueuedMessages == 0 && v.InFlight == 0 }
			va := waitBridge(t, a, "toB", "idle", mqtttest.Timeout, idle)
			if tc.twoBridges {
				vb := waitBridge(t, b, "toA", "idle", mqtttest.Timeout, idle)
				if va.Looped+vb.Looped == 0 {
					t.Errorf("no bridge counted a looped message: %+v %+v", va, vb)
				}
			}
			ta, perA := subA.counts()
			tb, perB := subB.counts()
			if ta != tc.wantA*m || tb != tc.wantB*m || len(perA) != 1 || len(perB) != 1 {
				t.Fatalf("after the bridges went idle: A %d copies %v, B %d copies %v; want %d each at A, %d at B", ta, perA, tb, perB, tc.wantA, tc.wantB)
			}
		})
	}
}

func contextTimeout() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), mqtttest.Timeout)
}

// TestBridgeClusterRunsOnOneNodeAndMoves runs the same bridge on three
// cluster nodes (real NATS servers): one node at a time connects it, the
// one holding its group's lease; SIGKILL that node and another takes it
// over, and everything the surviving nodes acknowledged arrives, each key
// in order.
func TestBridgeClusterRunsOnOneNodeAndMoves(t *testing.T) {
	const keys, perKey = 10, 200
	nc := natstest.Start(t, 3)
	central := startMosquitto(t, "")
	got := newSeqCollector()
	v3Collector(t, central.addr(), "collector", "site/sensors/#", got)
	nodes := startNodes(t, 3, nc.URLs(), "--bridge", bridgeFlag("central", central.addr(), "5", `sensors/# out 1 "" site/ ordered`))
	// running returns the index of the one node whose bridge is connected,
	// -1 while none is; more than one fails the test.
	running := func(skip int) int {
		at := -1
		for i, p := range nodes {
			if i == skip {
				continue
			}
			v := bridgeStatus(t, p, "central")
			switch v.State {
			case "connected":
				if at >= 0 {
					t.Fatalf("the bridge is connected on two nodes at once (%d and %d)", at, i)
				}
				at = i
			case "standby", "connecting", "disconnected":
			default:
				t.Fatalf("node %d: bridge state %q", i, v.State)
			}
		}
		return at
	}
	waitRunning := func(skip int, timeout time.Duration) int {
		at := -1
		if poll.Within(timeout, func() bool { at = running(skip); return at >= 0 }) { // the nodes' admin APIs
			return at
		}
		var states []string
		for i, p := range nodes {
			if i != skip {
				v := bridgeStatus(t, p, "central")
				states = append(states, fmt.Sprintf("node %d: %s (lease %q, last error %q)", i, v.State, v.Node, v.LastError))
			}
		}
		t.Fatalf("no node runs the bridge within %v: %s", timeout, strings.Join(states, "; "))
		return -1
	}
	victim := waitRunning(-1, 2*mqtttest.Timeout)
	var pubs []*mqtttest.V3
	for i, p := range nodes {
		if i != victim {
			pubs = append(pubs, mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, p.addrs["tcp"]), fmt.Sprintf("device-%d", i), true, nil))
		}
	}
	n := keys * perKey
	// Alternate publishers between the two survivors, a batch each: a key's
	// messages go through both, one batch after the other.
	const batch = 100
	var killedAt time.Time
	for from := 0; from < n; from += batch {
		if from >= n/3 && killedAt.IsZero() {
			nodes[victim].signal(t, syscall.SIGKILL)
			killedAt = time.Now()
		}
		publishPerKey(t, pubs[(from/batch)%2], "sensors", keys, from, from+batch, 50, nil)
		if !killedAt.IsZero() {
			running(victim) // never two survivors at once
		}
	}
	next := waitRunning(victim, 2*time.Minute)
	t.Logf("bridge ran on node %d; after its SIGKILL node %d runs it, %v later", victim, next, time.Since(killedAt).Round(time.Millisecond))
	got.wait(t, n, 2*time.Minute)
	got.verify(t, keys, perKey)
	t.Logf("%d messages, %d duplicates", n, got.dups)
}
