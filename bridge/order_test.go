package bridge

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// A bridge over a real dispatcher: the group settings the manager gives its
// groups, an in-memory log.

// memLog is a group log in memory.
type memLog struct {
	mu       sync.Mutex
	msgs     []keyshared.Message
	resolved map[uint64]bool
}

func (l *memLog) append(topic string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	off := uint64(len(l.msgs) + 1)
	l.msgs = append(l.msgs, keyshared.Message{Offset: off, Key: topic, Topic: topic, QoS: 1, Payload: []byte(strconv.FormatUint(off, 10))})
}

func (l *memLog) ReadFrom(from uint64, n int, buf []keyshared.Message) ([]keyshared.Message, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := int(max(from, 1)) - 1; i < len(l.msgs) && n > 0; i++ {
		if !l.resolved[l.msgs[i].Offset] {
			buf = append(buf, l.msgs[i])
			n--
		}
	}
	return buf, nil
}

func (l *memLog) Head() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return uint64(len(l.msgs))
}
func (l *memLog) LoadCursor() (uint64, error) { return 0, nil }
func (l *memLog) Resolve(offs []uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, o := range offs {
		l.resolved[o] = true
	}
}
func (l *memLog) DeadLetter(keyshared.DeadLetter) error { return nil }

// dispGroup is a bridge's Group over a keyshared.Dispatcher.
type dispGroup struct {
	name string
	d    *keyshared.Dispatcher
}

func (g *dispGroup) Name() string { return g.name }
func (g *dispGroup) AddMember(id string, recvMax int) error {
	return g.d.AddMember(id, keyshared.MemberOptions{ReceiveMaximum: recvMax})
}
func (g *dispGroup) RemoveMember(id string) error             { return g.d.RemoveMember(id) }
func (g *dispGroup) Ack(member string, off uint64)            { _ = g.d.Ack(member, off) }
func (g *dispGroup) Nack(member string, off uint64, r byte)   { _ = g.d.Nack(member, off, r) }
func (g *dispGroup) Reject(member string, off uint64, r byte) { _ = g.d.Reject(member, off, r) }
func (g *dispGroup) Info() (persistence.GroupInfo, error)     { return persistence.GroupInfo{}, nil }
func (g *dispGroup) Holder() (string, bool)                   { return "", false }
func (g *dispGroup) HeldHere() bool                           { return true }
func (g *dispGroup) Stats() (keyshared.Stats, keyshared.RouterStats) {
	return g.d.Stats(), keyshared.RouterStats{}
}
func (g *dispGroup) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
	defer cancel()
	_ = g.d.Close(ctx)
}

// dispLocal opens the bridge's groups as the broker does: a dispatcher
// with the settings Manager.GroupSettings gives them.
type dispLocal struct {
	t   *testing.T
	m   *Manager
	log *memLog
	g   *dispGroup
}

func (l *dispLocal) OpenGroup(n share.Name, out keyshared.Deliverer) (Group, error) {
	cfg, _, ok := l.m.GroupSettings(n.String(), keyshared.DefaultConfig())
	if !ok {
		l.t.Fatalf("%s is no bridge group", n)
	}
	cfg.Group = n.String()
	d, err := keyshared.New(cfg, l.log, out)
	if err != nil {
		return nil, err
	}
	l.g = &dispGroup{name: n.String(), d: d}
	return l.g, nil
}
func (l *dispLocal) NewInjector(string, func(string) bool) Injector { return nopInjector{} }

// connack5Max is an MQTT 5 CONNACK announcing a Receive Maximum.
func connack5Max(recvMax uint16) []byte {
	return mqtttest.Frame(mqttwire.TypeConnack, 0, []byte{0, 0}, mqtttest.Props(mqtttest.PropU16(mqttwire.PropReceiveMaximum, recvMax)))
}

// nextPublish reads the next PUBLISH and returns its payload and packet id.
func nextPublish(t *testing.T, c *remoteConn) (string, uint16) {
	t.Helper()
	p, err := mqttwire.DecodePublish(mqttwire.Version5, c.nextOf(t, mqttwire.TypePublish))
	if err != nil {
		t.Fatal(err)
	}
	return string(p.Payload), p.PacketID
}

// TestPipelinedRuleResendsInOrderAfterTheRemoteWent: a pipelined (not
// ordered) rule fills the remote's Receive Maximum; the remote goes without
// acknowledging (as when it is killed) while later messages wait for room.
// On the next connection what was in flight goes out again first, then the
// rest: the remote sees one topic's messages in the order they were
// published. The waiting ones went out first (found as "97 after 99" in
// TestBridgeRemoteRestartUnderLoad/keyline/pipelined).
func TestPipelinedRuleResendsInOrderAfterTheRemoteWent(t *testing.T) {
	remote := newFakeRemote(t)
	c := DefaultConfig()
	c.Name, c.Addresses, c.ClientID, c.Protocol = "b", []string{remote.ln.Addr().String()}, "edge", MQTT5
	c.ReconnectMin, c.ReconnectMax = 10*time.Millisecond, 50*time.Millisecond
	c.Rules = []Rule{{Pattern: "t/#", Direction: Out, QoS: 1}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	m, err := NewManager([]Config{c}, Options{BrokerID: "here", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	local := &dispLocal{t: t, m: m, log: &memLog{resolved: map[uint64]bool{}}}
	if err := m.Start(local); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
		defer cancel()
		if err := m.Stop(ctx); err != nil {
			t.Error(err)
		}
	})

	const window, n = 2, 5
	c1, _ := remote.accept(t)
	c1.send(t, connack5Max(window))
	for range n {
		local.log.append("t/1")
	}
	local.g.d.Notify()
	for i := 1; i <= window; i++ {
		if got, _ := nextPublish(t, c1); got != strconv.Itoa(i) {
			t.Fatalf("first connection: publish %q, want %d", got, i)
		}
	}
	c1.Close() // unacknowledged, with 3..5 waiting for room

	c2, _ := remote.accept(t)
	c2.send(t, connack5Max(window))
	for i := 1; i <= n; i++ {
		got, id := nextPublish(t, c2)
		if got != strconv.Itoa(i) {
			t.Fatalf("after reconnecting: publish %q, want %d (the messages of t/1 out of order)", got, i)
		}
		c2.send(t, mqttwire.AppendAck(nil, mqttwire.TypePuback, id, 0))
	}
}
