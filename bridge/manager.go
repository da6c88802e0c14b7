package bridge

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// Options are what the broker tells its bridges about itself.
type Options struct {
	// NodeID is the cluster node's id; "" on one node.
	NodeID string
	// BrokerID names this broker in the via mark of what it sends out (a
	// cluster's nodes may have ids of their own: a message that comes back
	// to another node goes round once more, then the next broker stops it).
	BrokerID string
	// MaxPacketSize is the largest packet the bridges take from a remote
	// (announced to MQTT 5 remotes): the broker's max-packet-size; 0: 1 MiB.
	MaxPacketSize uint32
	Logger        *slog.Logger
}

// Manager runs a broker's bridges.
type Manager struct {
	opts    Options
	bridges []*Bridge
	byShare map[string]*Bridge // share name of the bridge's groups -> bridge

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewManager validates the bridges' configurations and returns a manager
// that runs them once started.
func NewManager(cfgs []Config, opts Options) (*Manager, error) {
	if err := ValidateAll(cfgs); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.MaxPacketSize == 0 {
		opts.MaxPacketSize = maxFrame // the broker takes any size from clients; not so from a remote
	}
	m := &Manager{opts: opts, byShare: map[string]*Bridge{}}
	for _, c := range cfgs {
		b := newBridge(c, opts.NodeID, opts.BrokerID, opts.MaxPacketSize, opts.Logger)
		m.bridges = append(m.bridges, b)
		m.byShare[shareName(c.Name)] = b
	}
	return m, nil
}

// Len returns the number of bridges.
func (m *Manager) Len() int { return len(m.bridges) }

// GroupSettings returns the dispatcher and storage settings of a bridge's
// group, from base (the broker's defaults); false when name is not one.
// A bridge sees to its connection's timeouts itself and a lost connection
// is no failed attempt, so its groups wait without limit for an
// acknowledgement; ordered rules keep one message per key in flight, the
// others as many as the remote takes.
func (m *Manager) GroupSettings(name string, base keyshared.Config) (keyshared.Config, persistence.GroupConfig, bool) {
	n, err := share.Parse(name)
	if err != nil || !n.Internal() {
		return base, persistence.GroupConfig{}, false
	}
	b := m.bridgeOf(n.Share)
	if b == nil {
		return base, persistence.GroupConfig{}, false
	}
	d := base
	d.AckTimeout = 100 * 365 * 24 * time.Hour
	d.MaxDeliveries = b.cfg.MaxDeliveries
	if d.MaxDeliveries == 0 {
		d.MaxDeliveries = math.MaxInt32
	}
	d.Poison = keyshared.PoisonDeadLetter
	d.RetryBackoffBase, d.RetryBackoffMax = b.cfg.ReconnectMin, b.cfg.ReconnectMax
	d.MemberMaxInflight = b.cfg.MaxInflight
	d.Unordered = true
	for _, o := range b.outs {
		if o.name == n {
			d.Unordered = !o.rule.Ordered
		}
	}
	return d, b.cfg.Backlog, true
}

// bridgeOf returns the bridge whose groups have share name s.
func (m *Manager) bridgeOf(s string) *Bridge {
	if b := m.byShare[s]; b != nil {
		return b
	}
	if i := strings.LastIndexByte(s, '.'); i > 0 {
		return m.byShare[s[:i]] // "<share>.<n>": a second rule with the same local filter
	}
	return nil
}

// Start opens every bridge's groups and starts connecting. It returns once
// the groups exist (so publishes from then on are queued), not once
// connected.
func (m *Manager) Start(local Local) error {
	for _, b := range m.bridges {
		if err := b.open(local); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	for _, b := range m.bridges {
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			b.run(ctx)
			b.setState("stopped", "")
		}()
	}
	return nil
}

// Stop disconnects every bridge (gracefully, what is in flight is
// requeued) and waits for them, at most until ctx ends.
func (m *Manager) Stop(ctx context.Context) error {
	if m.cancel == nil {
		return nil
	}
	m.cancel()
	done := make(chan struct{})
	go func() {
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("bridge: stop: %w", ctx.Err())
	}
	for _, b := range m.bridges {
		for _, o := range b.outs {
			if o.group != nil {
				o.group.Close()
			}
		}
		if b.inj != nil {
			b.inj.Close()
		}
	}
	return nil
}

// Statuses returns every bridge's figures, in configuration order.
func (m *Manager) Statuses() []Status {
	out := make([]Status, len(m.bridges))
	for i, b := range m.bridges {
		out[i] = b.Status()
	}
	return out
}
