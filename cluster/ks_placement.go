package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Placement: which node holds each group's lease. Nodes announce their
// presence; the placement loop takes the leases a node should hold and
// takes over those of a holder whose node seems gone.

// kickPlacement asks the placement loop to run now.
func (g *Groups) kickPlacement() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

func (g *Groups) presenceLoop() {
	data, _ := json.Marshal(presenceMsg{Node: g.node.cfg.NodeID})
	t := time.NewTicker(presenceEvery)
	defer t.Stop()
	for {
		_ = g.node.nc.Publish(subjPresence, data)
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
	}
}

// placementLoop decides, every half second and on every change, which
// leases this node takes, takes over or hands over.
func (g *Groups) placementLoop() {
	t := time.NewTicker(presenceEvery)
	defer t.Stop()
	lastHandover := time.Time{}
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		case <-g.kick:
		}
		now := time.Now()
		live := g.presence.live(now)
		self := g.node.cfg.NodeID
		type action struct {
			gh   string
			over uint64
			hand *holder
		}
		var todo []action
		g.mu.Lock()
		for gh := range g.mu.metas {
			if g.mu.busy[gh] {
				continue
			}
			pref := preferred(gh, live)
			if h := g.mu.holders[gh]; h != nil {
				// Hand over to the preferred node once it has been up a while,
				// one group at a time, so a node joining does not stall all.
				if pref != self && g.presence.stableFor(pref, 5*time.Second, now) && now.Sub(lastHandover) > time.Second {
					lastHandover = now
					todo = append(todo, action{gh: gh, hand: h})
				}
				continue
			}
			lv, held := g.mu.leases[gh]
			switch {
			case !held:
				free := g.mu.freeSince[gh]
				if free.IsZero() {
					g.mu.freeSince[gh] = now
					free = now
				}
				if pref == self || now.Sub(free) > 3*time.Second {
					todo = append(todo, action{gh: gh})
				}
			case lv.node == self:
				// A lease of ours no holder runs (a restart within its TTL):
				// take it over at once.
				todo = append(todo, action{gh: gh, over: lv.rev})
			case pref == self && !g.presence.isLive(lv.node, now):
				todo = append(todo, action{gh: gh, over: lv.rev})
			}
		}
		for _, a := range todo {
			g.mu.busy[a.gh] = true
		}
		g.mu.Unlock()
		for _, a := range todo {
			g.goFunc(func() {
				defer func() {
					g.mu.Lock()
					delete(g.mu.busy, a.gh)
					g.mu.Unlock()
				}()
				switch {
				case a.hand != nil:
					g.log.Info("key-shared: handing a group over to its preferred node", "group", a.hand.name)
					a.hand.stopHolding(true)
				case a.over > 0:
					g.takeOver(a.gh, a.over)
				default:
					g.hold(a.gh, 0)
				}
			})
		}
	}
}

// suspect checks, once at a time per node, whether a silent node is gone:
// NATS has no responder for it. Silence alone (a loaded machine, a NATS
// reconnect) is not enough to drop a node's members.
func (g *Groups) suspect(node string) {
	p := g.presence
	p.mu.Lock()
	if p.mu.checking[node] || p.mu.gone[node] {
		p.mu.Unlock()
		return
	}
	p.mu.checking[node] = true
	p.mu.Unlock()
	g.goFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), g.node.cfg.RequestTimeout)
		alive, err := g.node.Alive(ctx, node)
		cancel()
		p.mu.Lock()
		delete(p.mu.checking, node)
		if err == nil && !alive && time.Since(p.mu.seen[node]) > nodeSilent {
			p.mu.gone[node] = true
		}
		p.mu.Unlock()
	})
}

// takeOver takes the lease of a holder whose node seems gone, once NATS
// confirms it (no responders) or it is our own stale lease.
func (g *Groups) takeOver(gh string, rev uint64) {
	g.mu.Lock()
	lv := g.mu.leases[gh]
	g.mu.Unlock()
	if lv.rev != rev {
		return
	}
	if lv.node != g.node.cfg.NodeID {
		ctx, cancel := context.WithTimeout(context.Background(), g.node.cfg.RequestTimeout)
		alive, err := g.node.Alive(ctx, lv.node)
		cancel()
		if err != nil || alive {
			return
		}
		g.log.Warn("key-shared: taking over the group of a node that is gone", "group", g.groupName(gh), "node", lv.node)
	}
	g.hold(gh, rev)
}

func (g *Groups) groupName(gh string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.metas[gh].Name
}

// hold acquires the lease of gh (over a dead holder's revision when over >
// 0) and runs the group's dispatcher here until the lease is lost or given
// up.
func (g *Groups) hold(gh string, over uint64) {
	g.mu.Lock()
	meta, ok := g.mu.metas[gh]
	stopped := g.mu.stopped
	g.mu.Unlock()
	if !ok || stopped {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.node.cfg.RequestTimeout)
	l, err := g.acquire(ctx, gh, over)
	cancel()
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			g.log.Debug("key-shared: lease not acquired", "group", meta.Name, "error", err)
		}
		return
	}
	h, err := g.startHolder(meta.Name, gh, l)
	if err != nil {
		g.log.Warn("key-shared: cannot start the group's dispatcher; releasing its lease", "group", meta.Name, "error", err)
		ctx, cancel := context.WithTimeout(context.Background(), g.node.cfg.RequestTimeout)
		_ = l.release(ctx)
		cancel()
		return
	}
	g.log.Info("key-shared: dispatching group", "group", meta.Name, "epoch", l.epoch)
	h.run()
	select {
	case <-g.closing: // won while the node was closing: hand it over
		h.stopHolding(true)
	default:
	}
}
