package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// Local is what a bridge needs of the broker it runs in; the broker's
// Key-Shared hook provides it.
type Local interface {
	// OpenGroup opens (creating it if needed) the internal group n and sends
	// its deliveries to out.
	OpenGroup(n share.Name, out keyshared.Deliverer) (Group, error)
	// NewInjector returns what publishes messages the bridge brings in;
	// they never go to the groups skip names.
	NewInjector(bridge string, skip func(group string) bool) Injector
}

// Group is an internal Key-Shared group as its in-process member sees it.
type Group interface {
	Name() string
	AddMember(id string, recvMax int) error
	RemoveMember(id string) error
	Ack(member string, offset uint64)
	Nack(member string, offset uint64, reason byte)
	Reject(member string, offset uint64, reason byte)
	Stats() (keyshared.Stats, keyshared.RouterStats)
	Info() (persistence.GroupInfo, error)
	// Holder is the node holding the group's lease as last seen (for
	// figures); HeldHere whether this node holds it now, by its own clock
	// (the bridge connects only then).
	Holder() (node string, clustered bool)
	HeldHere() bool
	Close()
}

// Injector publishes into the local broker. Publish returns once a QoS 1/2
// message is durable in the groups it goes to, or the error that refused it:
// one wrapping ErrRefused when it can never be taken (the bridge drops it),
// any other when it may be later (the bridge has the remote send it again).
type Injector interface {
	Publish(m *keyshared.Message, retain bool) error
	Close()
}

// ErrRefused marks an Injector's refusal of a message that no retry can change.
var ErrRefused = errors.New("bridge: the broker refuses the message")

// Loop marks. A bridge adds the MQTT 5 user property ViaProperty to every
// message it sends out (the id of the broker it leaves) and InProperty to
// every message it brings in (the id of the broker it enters). A message is
// not sent out of a broker it has left before, and not taken into a broker
// it has left or entered before; so messages cannot circle between brokers
// that bridge the same topics both ways, while a chain (in from one remote,
// out to another) still passes. MQTT 3.1.1 carries no properties: there,
// only a bridge's own groups (a message never goes back out through the
// bridge it came in by) and No Local stand between a message and a loop.
const (
	ViaProperty = "keyline-via"
	InProperty  = "keyline-in"
)

// Bridge is one configured bridge: its outbound rules' groups, its run loop
// and its figures.
type Bridge struct {
	cfg      Config
	local    Local
	node     string // cluster node id; "" on one node
	brokerID string
	member   string // the member id in the outbound groups
	log      *slog.Logger

	outs   []*outRule
	ins    []Rule
	anchor Group // whose lease places the bridge in a cluster
	inj    Injector
	// groups names the bridge's own groups (the injector skips them).
	groups map[string]bool
	// maxPacket is what the bridge announces it takes from the remote.
	maxPacket uint32

	// cur is the live session; nil while the bridge is not connected.
	cur atomic.Pointer[session]
	// noPrivate records that the remote refused try_private's mark.
	noPrivate atomic.Bool

	st counters
	mu struct {
		sync.Mutex
		lastErr     string
		lastErrAt   time.Time
		connectedAt time.Time
		addr        string
		state       string
		subscribed  bool // the remote answered the inbound rules' SUBSCRIBE
		// pendingRel holds the packet ids of QoS 2 publishes in flight when
		// a connection ended: a remote that kept the session may hold them
		// as received, and they are released on the next connection before
		// the ids are used again.
		pendingRel map[uint16]bool
		// inQoS2 holds the ids of the remote's QoS 2 publishes the bridge
		// has taken in and acknowledged with PUBREC, awaiting PUBREL: a
		// resent one is not taken in twice.
		inQoS2 map[uint16]bool
	}
}

// counters are the bridge's monotonic totals.
type counters struct {
	sent, received, dropped, looped, refused, nacked, connects, failures atomic.Uint64
}

// outRule is one outbound rule and its group; it is the group's Deliverer.
type outRule struct {
	b     *Bridge
	rule  Rule
	name  share.Name
	group Group
}

func newBridge(cfg Config, node, brokerID string, maxPacket uint32, log *slog.Logger) *Bridge {
	b := &Bridge{cfg: cfg, node: node, brokerID: brokerID, maxPacket: maxPacket, groups: map[string]bool{},
		log: log.With("bridge", cfg.Name)}
	b.member = "bridge:" + cfg.Name
	if node != "" {
		b.member += "@" + node
	}
	b.mu.state = "stopped"
	b.mu.pendingRel = map[uint16]bool{}
	b.mu.inQoS2 = map[uint16]bool{}
	seen := map[string]int{}
	for _, r := range cfg.Rules {
		if r.Direction&In != 0 {
			b.ins = append(b.ins, r)
		}
		if r.Direction&Out == 0 {
			continue
		}
		n := share.Name{Share: shareName(cfg.Name), Filter: r.LocalFilter()}
		if k := seen[n.Filter]; k > 0 {
			n.Share = fmt.Sprintf("%s.%d", n.Share, k+1)
		}
		seen[n.Filter]++
		b.outs = append(b.outs, &outRule{b: b, rule: r, name: n})
		b.groups[n.String()] = true
	}
	return b
}

// shareName is the share name of a bridge's groups.
func shareName(bridge string) string { return share.InternalPrefix + "bridge." + bridge }

// anchorName is the group that places a bridge without outbound rules.
func anchorName(bridge string) share.Name {
	return share.Name{Share: shareName(bridge), Filter: "$keyline/bridge/" + bridge}
}

// open opens the bridge's groups and its injector.
func (b *Bridge) open(local Local) error {
	b.local = local
	for _, o := range b.outs {
		g, err := local.OpenGroup(o.name, o)
		if err != nil {
			return fmt.Errorf("bridge %s: group %s: %w", b.cfg.Name, o.name, err)
		}
		o.group = g
	}
	if len(b.outs) > 0 {
		b.anchor = b.outs[0].group
	} else {
		n := anchorName(b.cfg.Name)
		g, err := local.OpenGroup(n, anchorOut{b})
		if err != nil {
			return fmt.Errorf("bridge %s: group %s: %w", b.cfg.Name, n, err)
		}
		b.anchor = g
		b.groups[n.String()] = true
	}
	b.inj = local.NewInjector(b.cfg.Name, func(g string) bool { return b.groups[g] })
	return nil
}

// anchorOut takes whatever reaches the anchor group of a bridge without
// outbound rules (a client publishing to its topic) and lets it go.
type anchorOut struct{ b *Bridge }

func (a anchorOut) Deliver(member string, m *keyshared.Message, _ int) bool {
	if m.QoS > 0 {
		a.b.anchor.Ack(member, m.Offset)
	}
	return true
}
func (anchorOut) Revoke(string, uint64) {}

// Deliver implements keyshared.Deliverer: it sends m on the live session,
// or refuses it while there is none (the dispatcher offers it again).
func (o *outRule) Deliver(member string, m *keyshared.Message, _ int) bool {
	s := o.b.cur.Load()
	if s == nil {
		return false
	}
	return s.publish(o, member, m)
}

// Revoke implements keyshared.Deliverer: the dispatcher no longer awaits the
// delivery (the member left); a late acknowledgement is ignored.
func (o *outRule) Revoke(_ string, offset uint64) {
	if s := o.b.cur.Load(); s != nil {
		s.forgetOffset(o, offset)
	}
}

// run connects, serves and reconnects until ctx ends. In a cluster the
// bridge connects only while this node holds its anchor group's lease.
func (b *Bridge) run(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		if !b.placed(ctx) {
			return
		}
		b.setState("connecting", "")
		s, err := b.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			b.st.failures.Add(1)
			b.setError(err)
			b.setState("disconnected", "")
			if !sleepCtx(ctx, backoff(b.cfg.ReconnectMin, b.cfg.ReconnectMax, failures)) {
				return
			}
			continue
		}
		b.st.connects.Add(1)
		began := time.Now()
		err = b.serve(ctx, s)
		if ctx.Err() != nil {
			return
		}
		b.setError(err)
		b.setState("disconnected", "")
		b.log.Warn("bridge: connection ended; reconnecting", "address", s.c.addr, "error", err)
		if time.Since(began) > b.cfg.ReconnectMax {
			failures = 0 // it held for a while: start the backoff over
		}
		failures++
		if !sleepCtx(ctx, backoff(b.cfg.ReconnectMin, b.cfg.ReconnectMax, failures)) {
			return
		}
	}
}

// placed waits until this node holds the anchor's lease (at once on one
// node); false when ctx ended first.
func (b *Bridge) placed(ctx context.Context) bool {
	for {
		if b.holdsLease() {
			return true
		}
		b.setState("standby", "")
		if !sleepCtx(ctx, placementPoll) {
			return false
		}
	}
}

// placementPoll is how often a clustered bridge looks at who holds its
// anchor group's lease (the cluster places groups every half second).
const placementPoll = 250 * time.Millisecond

func (b *Bridge) holdsLease() bool { return b.anchor.HeldHere() }

// backoff is the delay before reconnection attempt n (>= 1): min doubling
// up to max, of which a random half to all is taken (a fleet of sites that
// lost the same uplink does not reconnect in step).
func backoff(min, max time.Duration, n int) time.Duration {
	d := min
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	d = time.Duration(float64(min1(d, max)) * (0.5 + rand.Float64()/2))
	return max1(d, time.Millisecond)
}

func min1(d, ceil time.Duration) time.Duration {
	if d > ceil {
		return ceil
	}
	return d
}

func max1(d, floor time.Duration) time.Duration {
	if d < floor {
		return floor
	}
	return d
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (b *Bridge) setError(err error) {
	if err == nil {
		return
	}
	b.mu.Lock()
	b.mu.lastErr, b.mu.lastErrAt = err.Error(), time.Now()
	b.mu.Unlock()
}

func (b *Bridge) setState(state, addr string) {
	b.mu.Lock()
	b.mu.state = state
	if state == "connected" {
		b.mu.addr, b.mu.connectedAt = addr, time.Now()
	} else if state != "connecting" {
		b.mu.addr, b.mu.connectedAt, b.mu.subscribed = "", time.Time{}, false
	}
	b.mu.Unlock()
}

// errMoved ends a session whose node no longer holds the bridge's lease.
var errMoved = errors.New("bridge: the cluster placed the bridge on another node")

// serve runs a session until its connection ends, ctx ends, or the bridge's
// lease moves away; then it takes the bridge's members out of its groups,
// which requeues what was in flight.
func (b *Bridge) serve(ctx context.Context, s *session) error {
	b.attach(s)
	b.setState("connected", s.c.addr)
	b.log.Info("bridge: connected", "address", s.c.addr, "session_present", s.c.ack.sessionPresent, "receive_maximum", s.c.ack.receiveMax)
	tick := time.NewTicker(s.tickEvery())
	defer tick.Stop()
	var err error
loop:
	for {
		select {
		case <-ctx.Done():
			s.c.disconnect(0, ctx.Err())
			break loop
		case <-s.c.done:
			break loop
		case now := <-tick.C:
			if e := s.check(now); e != nil {
				s.c.disconnect(0x80, e) // a client may not send 0x8D (keep alive timeout): unspecified error
				break loop
			}
			if !b.holdsLease() {
				s.c.disconnect(0, errMoved)
				break loop
			}
		}
	}
	<-s.c.done
	err = s.c.err
	b.detach(s)
	return err
}

// Status is what the admin API, the metrics, the console and `keyline
// bridges` show of a bridge.
type Status struct {
	Name     string
	ClientID string
	State    string // connected, connecting, disconnected, standby (cluster: another node runs it), stopped
	// Address is the remote address connected to; ConnectedAt since when.
	Address     string
	ConnectedAt time.Time
	// Subscribed reports that the remote answered the inbound rules'
	// SUBSCRIBE on this connection (always true without inbound rules).
	Subscribed bool
	Protocol   byte
	Node       string // cluster: the node holding the bridge's lease
	// QueuedMessages and QueuedBytes are what the outbound groups hold
	// (bytes include acknowledged messages not yet trimmed from the log).
	QueuedMessages, QueuedBytes uint64
	InFlight                    int
	// Sent counts messages the remote acknowledged (or that went at QoS 0);
	// Received those brought in and published here.
	Sent, Received uint64
	// Dropped counts messages that did not cross: looped back (Looped), QoS 0
	// with no connection, dropped by the backlog policy or refused by a full
	// backlog. DeadLetters are the messages the remote refused for good.
	Dropped, Looped uint64
	// Nacked counts the remote's refusals (retried or dead-lettered).
	Nacked uint64
	// Refused counts messages from the remote this broker refused for now
	// (a full backlog): the bridge reconnects and the remote sends them again.
	Refused     uint64
	DeadLetters uint64
	Connects    uint64
	Failures    uint64 // connection attempts that failed
	LastError   string
	LastErrorAt time.Time
	Groups      []string
}

// Status returns the bridge's figures.
func (b *Bridge) Status() Status {
	b.mu.Lock()
	st := Status{Name: b.cfg.Name, State: b.mu.state, Address: b.mu.addr, ConnectedAt: b.mu.connectedAt,
		LastError: b.mu.lastErr, LastErrorAt: b.mu.lastErrAt, Subscribed: b.mu.subscribed && b.mu.state == "connected"}
	b.mu.Unlock()
	st.Protocol, st.ClientID = b.cfg.Protocol, b.cfg.ClientID
	st.Sent, st.Received = b.st.sent.Load(), b.st.received.Load()
	st.Looped, st.Nacked = b.st.looped.Load(), b.st.nacked.Load()
	st.Dropped = b.st.dropped.Load() + st.Looped
	st.Connects, st.Failures, st.Refused = b.st.connects.Load(), b.st.failures.Load(), b.st.refused.Load()
	if b.anchor != nil {
		st.Node, _ = b.anchor.Holder()
	}
	if s := b.cur.Load(); s != nil {
		st.InFlight = s.inflight()
	}
	for _, o := range b.outs {
		if o.group == nil {
			continue
		}
		st.Groups = append(st.Groups, o.group.Name())
		if gi, err := o.group.Info(); err == nil {
			st.QueuedMessages += gi.Backlog
			st.QueuedBytes += gi.StoredBytes
			st.DeadLetters += gi.DeadLetters
			st.Dropped += gi.Dropped + gi.Rejected
		}
		_, r := o.group.Stats()
		st.Dropped += r.Dropped + r.Skipped
	}
	return st
}
