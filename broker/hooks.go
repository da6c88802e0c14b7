package broker

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/outbox"
	"github.com/keyline-mq/keyline/persistence"
)

// hookRow is one hook of the broker's chain and why it sits where it does.
// mochi calls hooks in the order they were added, and the order decides
// correctness: a hook that answers OnPublish with CodeSuccessIgnore (the
// fan-out's, for what it delivers itself) ends that chain, and a hook that
// changes a SUBSCRIBE changes it for those after it.
type hookRow struct {
	hook mqtt.Hook
	on   bool // false: not in this mode
	why  string
}

// hookTable is the broker's hook chain, in order. The hooks are built first
// (buildHooks), each with what it needs from the others.
func (b *Broker) hookTable(protocol *hooks.Protocol) []hookRow {
	single, clustered := !b.clusterMode(), b.clusterMode()
	return []hookRow{
		{b.rates, true, "first: its OnConnect refuses a CONNECT past the connect rates before any other hook spends work on it (the cluster's takeover, the fan-out's session) and before Auth hashes its password"},
		{b.auth, true, "right after the rate limits: authentication, the ACL and client id ownership decide before any other hook acts on a client"},
		{new(hooks.BridgeMark), true, "before the hooks that take a SUBSCRIBE: a bridge's filters get No Local before they are stored (mosquitto's try_private)"},
		{b.storage, single, "before Key-Shared: a subscription that cannot be stored is refused before Key-Shared makes the client a member"},
		{b.retained, true, "before the cluster and the fan-out: its OnSubscribe makes a SUBSCRIBE wait until what other nodes retained is in the index the fan-out sends retained messages from"},
		{b.keySharedHook(), true, "before the cluster and the fan-out: it takes the $share part of every publish before the fan-out's OnPublish ends the chain"},
		{b.cluster, clustered, "before the fan-out: forwarding to other nodes must not depend on mochi's routing, which the fan-out's OnPublish ends"},
		{protocol, true, "anywhere: its OnConnect (max keep alive) depends on no other hook; its CONNACK and ack corrections run in the packet-encode hook"},
		{b.fanout, true, "after every hook that must see a publish: its OnPublish answers CodeSuccessIgnore for the deliveries it makes itself"},
		{&hooks.PacketReader{Rates: b.rates, Auth: b.auth, KeyShared: b.keyShared, Fanout: b.fanout}, true, "the only OnPacketRead hook (mochi copies a packet per hook): the rate limits hold back a publisher first, Auth renames $SYS publishes for the ACL check, Key-Shared takes its members' acks before the fan-out takes its outboxes'"},
		{&hooks.PacketEncoder{Auth: b.auth, Retained: b.retained, Cluster: b.cluster, Protocol: protocol, Fanout: b.fanout}, true, "the only OnPacketEncode hook (mochi copies a packet per hook): Protocol maps CONNACK codes after the steps that set them, the fan-out marks acks last"},
		{&hooks.Observe{Watching: b.ops.Watching, Published: b.ops.Published}, true, "last: it sees publishes once they are routed (the console's topic streams)"},
	}
}

// addHooks builds the hooks and adds them to mochi in hookTable's order.
func (b *Broker) addHooks() error {
	protocol, err := b.buildHooks()
	if err != nil {
		return err
	}
	b.ops = b.newOps()
	for _, r := range b.hookTable(protocol) {
		if !r.on {
			continue
		}
		if err := b.server.AddHook(r.hook, nil); err != nil {
			return fmt.Errorf("broker: %s hook: %w", r.hook.ID(), err)
		}
	}
	return nil
}

// buildHooks builds every hook, each after those it is given: the fan-out
// before Key-Shared (whose deliveries take packet ids from the fan-out's
// session outboxes), Key-Shared before Storage (which does not store what
// Key-Shared's group logs hold), Auth last (a session it discards goes from
// the others).
func (b *Broker) buildHooks() (*hooks.Protocol, error) {
	// The auth policy (ledger, password file, JWT keys) first: its ACL is
	// the fan-out's and Key-Shared's read check, and a reload swaps it
	// under all of them (reload.go).
	policy, err := authPolicy(&b.cfg, b.log)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	rules := hooks.NewACL(policy)
	b.rates = hooks.NewRateLimits(b.cfg.RateLimits.settings())
	var canRead func(*mqtt.Client, string) bool
	if rules.Configured() {
		canRead = rules.CanRead
	} else {
		b.warnOpen()
	}
	// In cluster mode sessions, retained messages and Key-Shared groups
	// live in the cluster, not in the data file.
	b.retained = hooks.NewRetained(b.server)
	if b.clusterMode() {
		if err := b.joinCluster(); err != nil {
			return nil, err
		}
		b.be = b.clusterBackends()
	} else {
		var err error
		if b.be, err = b.singleBackends(); err != nil {
			return nil, fmt.Errorf("broker: %w", err)
		}
	}
	var spill *outbox.Spill
	if b.cfg.SpillAfter > 0 && b.cfg.DataDir != "" {
		var err error
		if spill, err = outbox.NewSpill(filepath.Join(b.cfg.DataDir, persistence.SpillDir), int64(b.cfg.SpillAfter)); err != nil {
			return nil, fmt.Errorf("broker: %w", err)
		}
	}
	b.fanout = hooks.NewFanout(b.server, hooks.FanoutConfig{
		CanRead: canRead,
		Limits: func(cl *mqtt.Client) connq.Limits {
			l, _ := b.cfg.connLimits(cl.Net.Listener, cl.ID) // validated
			return l
		},
		Store:           b.be.outbox,
		MaxSessionBytes: int64(b.cfg.MaxSessionQueueBytes),
		MaxTotalBytes:   int64(b.cfg.MaxQueuedBytes),
		Spill:           spill,
		SharedElsewhere: true, // the Key-Shared hook delivers every $share group
		Refs:            b.be.refs,
	})
	if b.cluster != nil {
		b.cluster.Outboxes = b.fanout // a session taken over gets its queued messages there
	}
	b.keyShared = hooks.NewKeyShared(b.server, b.be.groups, hooks.KeySharedConfig{
		KeyProperty:        b.cfg.KeyProperty,
		GroupSettings:      b.groupSettingsOf,
		CanRead:            canRead,
		KeyFilters:         b.be.keyFilters,
		MaxKeySize:         int(b.cfg.MaxKeySize),
		MaxGroups:          b.cfg.MaxGroups,
		MaxGroupsPerClient: b.cfg.MaxGroupsPerClient,
		MaxGroupsPerOwner:  b.cfg.MaxGroupsPerUser,
		GroupOwner:         b.groupOwner,
		AllocPacketID:      b.fanout.AllocPacketID, // the fan-out's session outboxes share each client's packet ids
	})
	b.clusterKS.Store(b.keyShared)
	if !b.clusterMode() {
		b.storage = hooks.NewStorage(b.server, b.sessions, b.be.sessions, b.keyShared.Owns) // the group log is the durable copy of those
	}
	b.reload.identity.Store(uint32(b.cfg.TLSIdentity))
	b.reload.last = b.cfg
	b.auth = hooks.NewAuth(b.server, rules, hooks.AuthConfig{
		FreshSessions: b.cfg.SessionOwnership == OwnershipFresh,
		OnDiscard:     b.discardSession,
		Identity:      b.certIdentity,
		Admit:         b.rates.AdmitUser,
	})
	return &hooks.Protocol{MaxKeepAlive: uint16(b.cfg.MaxKeepAlive / time.Second)}, nil
}

// discardSession forgets a session Auth discarded for another user's
// CONNECT (session-ownership: fresh) wherever it is kept, as mochi's
// expiry would.
func (b *Broker) discardSession(cl *mqtt.Client) {
	b.be.expire(cl)
	b.fanout.OnClientExpired(cl)
}

// warnOpen warns of listeners reachable beyond loopback without auth.
func (b *Broker) warnOpen() {
	var exposed []string
	for _, ln := range b.mqttLns {
		if !isLoopback(ln.Address()) {
			exposed = append(exposed, ln.proto+" "+ln.Address())
		}
	}
	if len(exposed) > 0 {
		b.log.Warn("no auth configured: any client that reaches these listeners may connect, publish and subscribe; add an auth section to the config file to restrict them",
			"listeners", strings.Join(exposed, ", "))
	}
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
