package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/keyshared"
)

// Key-Shared groups across nodes. A `$share/<share>/<filter>` group is one
// group in the whole cluster:
//
//	stream KL_G_<hash>, subject kl.g.<hash>   the group log (offset = stream sequence)
//	bucket KL_GROUPS, key m.<hash>             the group's name, config and creation
//	                  key l.<hash>             its lease (TTL): which node dispatches
//	                  key s.<hash>             its state (cursor, acks above it), fenced by the lease
//	stream KL_DLQ, subject kl.x.<hash>         its dead letters (id = stream sequence)
//	kl.k.<hash>                                requests to the lease holder (members, acks, stats)
//	kl.t.<hash>                                from the holder to every node (takeover, durability)
//	kl.d.<node hash>                           deliveries from holders to a node's members
//	kl.p                                       node heartbeats (placement, failure detection)
//
// <hash> is a digest of the group name. Every node appends the QoS 1/2
// publishes it receives to the group log before the publisher's PUBACK;
// the holder of the lease runs the group's one keyshared.Dispatcher over
// it, delivers to members on its node directly and to others through their
// node. The holder is the node the rendezvous hash of the group and the
// live nodes prefers, so dispatchers spread over nodes.

// Names of the group storage.
const (
	BucketGroups = "KL_GROUPS"
	StreamDLQ    = "KL_DLQ"

	groupStreamPrefix = "KL_G_"
	subjGroupLog      = Prefix + ".g."
	subjGroupDLQ      = Prefix + ".x."
	subjHolder        = Prefix + ".k."
	subjTakeover      = Prefix + ".t."
	subjDeliver       = Prefix + ".d."
)

func groupHash(name string) string { return hashToken(name) }

// GroupStream returns the name of the stream holding a group's log.
func GroupStream(name string) string { return groupStream(groupHash(name)) }

func groupStream(gh string) string   { return groupStreamPrefix + gh }
func groupSubject(gh string) string  { return subjGroupLog + gh }
func dlqSubject(gh string) string    { return subjGroupDLQ + gh }
func holderSubject(gh string) string { return subjHolder + gh }

// GroupsConfig configures Key-Shared groups across nodes.
type GroupsConfig struct {
	// Settings returns a group's dispatcher and backlog settings.
	Settings func(name string) (keyshared.Config, keyshared.GroupConfig)
	// LeaseTTL is how long a lease lives without renewal: it must exceed a
	// NATS leader election (4-9 s) plus a renewal period. Default 15 s.
	LeaseTTL time.Duration
	// LeaseMargin: a holder stops this long before its lease could expire.
	LeaseMargin time.Duration
	// RenewEvery is the renewal period (default LeaseTTL/5).
	RenewEvery time.Duration
	// StateEvery is how often a holder writes its state when it changed.
	StateEvery time.Duration
	// GatherTimeout bounds a takeover's wait for the other nodes' resyncs.
	GatherTimeout time.Duration
	// Fits, when set, makes a member's Fits (keyshared.MemberOptions) from
	// the packet limit its node reported in its join, so that the holder
	// offers a member only what it can take, as one node does (the
	// broker's hooks.KeySharedFits; nil: no such check).
	Fits func(l keyshared.PacketLimit, qos byte) func(*keyshared.Message) bool
	// OnDeadLetter, when set, is told of every dead letter the holder
	// stored (the broker publishes it live on $dlq/...).
	OnDeadLetter func(group string, d keyshared.DeadLetter)
	// OnGroup, when set, is told of a group another node created, so that
	// this node's publishes reach it too.
	OnGroup func(name string)
	Logger  *slog.Logger
}

func (c *GroupsConfig) withDefaults() GroupsConfig {
	out := *c
	if out.LeaseTTL == 0 {
		out.LeaseTTL = 15 * time.Second
	}
	if out.LeaseMargin == 0 {
		out.LeaseMargin = 2 * time.Second
	}
	if out.RenewEvery == 0 {
		out.RenewEvery = out.LeaseTTL / 5
	}
	if out.StateEvery == 0 {
		out.StateEvery = 100 * time.Millisecond
	}
	if out.GatherTimeout == 0 {
		out.GatherTimeout = 2 * time.Second
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.Settings == nil {
		out.Settings = func(string) (keyshared.Config, keyshared.GroupConfig) {
			return keyshared.DefaultConfig(), keyshared.GroupConfig{}
		}
	}
	return out
}

// GroupsStats are a node's Key-Shared counters.
type GroupsStats struct {
	// AnswersDropped counts members' acks, nacks and rejects that reached a
	// holder's dispatcher after it closed (see holder.answer).
	AnswersDropped atomic.Uint64
}

// groupMeta is the value of m.<hash>.
type groupMeta struct {
	Name    string                `json:"name"`
	Config  keyshared.GroupConfig `json:"config"`
	Created time.Time             `json:"created"`
}

// Groups is a node's part in the cluster's Key-Shared groups: the store the
// broker's hook appends to and administers through (keyshared.Backend),
// the groups' node sides (Open), and the holders of the leases this node
// won. Safe for concurrent use.
type Groups struct {
	Stats GroupsStats

	node     *Node
	cfg      GroupsConfig
	log      *slog.Logger
	kv       jetstream.KeyValue
	presence *presence
	appends  *appender

	mu struct {
		sync.Mutex
		metas     map[string]groupMeta // group hash -> meta
		leases    map[string]leaseView // group hash -> lease as watched
		freeSince map[string]time.Time // group hash -> when its lease was first seen free
		nodes     map[string]*nodeGroup
		holders   map[string]*holder
		busy      map[string]bool // acquisitions and releases under way
		stopped   bool
		draining  bool // Close waits for the goroutines: start no more
	}
	kick     chan struct{}
	closing  chan struct{} // closed when Close begins: holders hand over
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
	subs     []*nats.Subscription
	watcher  jetstream.KeyWatcher
}

// StartGroups makes the bucket and the dead-letter stream, starts watching
// leases and groups, and joins the placement of dispatchers.
func (n *Node) StartGroups(ctx context.Context, cfg GroupsConfig) (_ *Groups, err error) {
	cfg = cfg.withDefaults()
	g := &Groups{node: n, cfg: cfg, log: cfg.Logger, presence: newPresence(n.cfg.NodeID),
		kick: make(chan struct{}, 1), closing: make(chan struct{}), stop: make(chan struct{})}
	g.mu.metas = map[string]groupMeta{}
	g.mu.leases = map[string]leaseView{}
	g.mu.freeSince = map[string]time.Time{}
	g.mu.nodes = map[string]*nodeGroup{}
	g.mu.holders = map[string]*holder{}
	g.mu.busy = map[string]bool{}
	g.appends = newAppender(g)
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	w := newStartWait(n.log)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		g.kv, errs[0] = n.ensureBucket(ctx, w, jetstream.KeyValueConfig{
			Bucket: BucketGroups, Description: "Keyline Key-Shared groups: names, leases, state",
			History: 1, Storage: jetstream.FileStorage, Replicas: n.replicas, LimitMarkerTTL: time.Second,
		})
	}()
	go func() {
		defer wg.Done()
		errs[1] = n.ensureStream(ctx, w, jetstream.StreamConfig{
			Name: StreamDLQ, Description: "Keyline Key-Shared dead letters", Subjects: []string{subjGroupDLQ + ">"},
			Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage, Replicas: n.replicas,
			Duplicates: 2 * time.Minute, AllowDirect: true,
		})
	}()
	wg.Wait()
	if err := joinLine(errs...); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	// The watcher lives as long as the node's groups: not on ctx.
	if err := n.retryStart(ctx, w, "a watcher of "+BucketGroups, func(context.Context) (err error) {
		g.watcher, err = g.kv.WatchFiltered(context.Background(), []string{"l.*", "m.*"})
		return err
	}); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	for _, s := range []struct {
		subj string
		cb   nats.MsgHandler
	}{{subjPresence, g.presence.heard}, {subjTakeover + "*", g.onTakeover}, {subjDeliver + NodeHash(n.cfg.NodeID), g.onDown}} {
		sub, err := n.nc.Subscribe(s.subj, s.cb)
		if err != nil {
			return nil, fmt.Errorf("cluster: subscribe %s: %w", s.subj, err)
		}
		g.subs = append(g.subs, sub)
	}
	// Wait for the current groups and leases before taking part.
	if err := g.loadWatch(ctx); err != nil {
		return nil, err
	}
	f := func() { g.kickPlacement(); g.resyncAll() }
	n.onReconnect.Store(&f)
	g.goFunc(g.watchLoop)
	g.goFunc(g.presenceLoop)
	g.goFunc(g.placementLoop)
	return g, nil
}

// goFunc runs f on a goroutine Close waits for; once Close waits, nothing
// new starts.
func (g *Groups) goFunc(f func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.mu.draining {
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f()
	}()
}

// Close releases the leases this node holds (each after a last state
// write, so the next holder starts at once) and stops.
func (g *Groups) Close() {
	g.stopOnce.Do(func() {
		close(g.closing)
		g.mu.Lock()
		g.mu.stopped = true
		holders := make([]*holder, 0, len(g.mu.holders))
		for _, h := range g.mu.holders {
			holders = append(holders, h)
		}
		nodes := make([]*nodeGroup, 0, len(g.mu.nodes))
		for _, ng := range g.mu.nodes {
			nodes = append(nodes, ng)
		}
		g.mu.Unlock()
		var wg sync.WaitGroup
		for _, h := range holders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				h.stopHolding(true)
			}()
		}
		wg.Wait()
		for _, ng := range nodes {
			ng.close()
		}
		if g.node.nc != nil {
			data, _ := json.Marshal(presenceMsg{Node: g.node.cfg.NodeID, Bye: true})
			_ = g.node.nc.Publish(subjPresence, data)
		}
		close(g.stop)
		if g.watcher != nil {
			_ = g.watcher.Stop()
		}
		for _, s := range g.subs {
			_ = s.Unsubscribe()
		}
		g.mu.Lock()
		g.mu.draining = true
		g.mu.Unlock()
		g.wg.Wait()
		g.appends.close()
	})
}

func (g *Groups) stopped() bool {
	select {
	case <-g.stop:
		return true
	default:
		return false
	}
}

// loadWatch applies the watcher's initial values (up to its nil marker).
func (g *Groups) loadWatch(ctx context.Context) error {
	for {
		select {
		case e, ok := <-g.watcher.Updates():
			if !ok {
				return fmt.Errorf("cluster: watch %s closed", BucketGroups)
			}
			if e == nil {
				return nil
			}
			g.applyEntry(e)
		case <-ctx.Done():
			return fmt.Errorf("cluster: loading groups: %w", ctx.Err())
		}
	}
}

func (g *Groups) watchLoop() {
	for {
		select {
		case <-g.stop:
			return
		case e, ok := <-g.watcher.Updates():
			if !ok {
				return
			}
			if e != nil {
				g.applyEntry(e)
			}
		}
	}
}

// applyEntry takes in a change of a lease or a group's meta.
func (g *Groups) applyEntry(e jetstream.KeyValueEntry) {
	kind, gh, ok := strings.Cut(e.Key(), ".")
	if !ok {
		return
	}
	var created string
	g.mu.Lock()
	switch kind {
	case "m":
		var m groupMeta
		if e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &m) == nil && m.Name != "" {
			if _, known := g.mu.metas[gh]; !known {
				created = m.Name
			}
			g.mu.metas[gh] = m
		} else {
			delete(g.mu.metas, gh)
		}
	case "l":
		if lv, ok := parseLease(e); ok {
			g.mu.leases[gh] = lv
			delete(g.mu.freeSince, gh)
		} else {
			delete(g.mu.leases, gh)
			g.mu.freeSince[gh] = time.Now()
		}
	}
	ng := g.mu.nodes[gh]
	lv, held := g.mu.leases[gh]
	g.mu.Unlock()
	if kind == "l" && ng != nil && held {
		ng.holderChanged(lv.node, lv.epoch)
	}
	if created != "" && g.cfg.OnGroup != nil {
		g.goFunc(func() { g.cfg.OnGroup(created) })
	}
	g.kickPlacement()
}

// Known reports whether group name exists in the cluster.
func (g *Groups) Known(name string) bool {
	_, err := g.known(name)
	return err == nil
}

// notify tells the holder of gh that its log has new messages.
func (g *Groups) notify(gh string) {
	g.mu.Lock()
	h := g.mu.holders[gh]
	g.mu.Unlock()
	if h != nil {
		h.d.Notify()
	}
}

// holderOf returns the lease holder of gh as watched.
func (g *Groups) holderOf(gh string) (leaseView, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	lv, ok := g.mu.leases[gh]
	return lv, ok
}

func (g *Groups) localHolder(gh string) *holder {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.holders[gh]
}

func (g *Groups) nodeGroupOf(gh string) *nodeGroup {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.nodes[gh]
}

// resyncAll makes every node side resync with its holder (after this node
// reconnected to NATS: requests in flight may have been lost).
func (g *Groups) resyncAll() {
	for _, ng := range g.nodeGroups() {
		ng.kickRetry()
	}
}

// nodeGroups returns the node sides of every group open here.
func (g *Groups) nodeGroups() []*nodeGroup {
	g.mu.Lock()
	defer g.mu.Unlock()
	nodes := make([]*nodeGroup, 0, len(g.mu.nodes))
	for _, ng := range g.mu.nodes {
		nodes = append(nodes, ng)
	}
	return nodes
}
