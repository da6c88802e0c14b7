package hooks

import (
	"encoding/json"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/mochi-mqtt/server/v2/system"
)

// sysInterval is how often a node sends its figures and refreshes the
// cluster totals; a node not heard from for nodeStale is left out.
const (
	sysInterval = 2 * time.Second
	nodeStale   = 5 * sysInterval
)

// nodeFigures is what a node tells the others about itself.
type nodeFigures struct {
	Node             string    `json:"node"`
	ClientsConnected int64     `json:"clients_connected"`
	Sessions         int64     `json:"sessions"`
	Subscriptions    int64     `json:"subscriptions"`
	MessagesReceived int64     `json:"messages_received"`
	MessagesSent     int64     `json:"messages_sent"`
	Inflight         int64     `json:"inflight"`
	At               time.Time `json:"-"`
}

// sysNode is what the node figures need of the cluster node.
type sysNode interface {
	NodeID() string
	// PublishNodeStats sends this node's figures to the others.
	PublishNodeStats(data []byte) error
}

// nodeFigureSource is what the node figures read of mochi: its counters
// and how many clients (sessions) it holds.
type nodeFigureSource struct {
	info    *system.Info
	clients interface{ Len() int }
}

// sysFigures owns the figures of the nodes of the cluster: it sends this
// node's to the others, keeps theirs (nodeTable, its own lock) and
// publishes the totals as retained $SYS topics on this node.
type sysFigures struct {
	node   sysNode // set by Cluster.SetNode
	mochi  nodeFigureSource
	inject injector
	inline *mqtt.Client // publishes the $SYS topics
	stats  *ClusterStats
	log    func() *slog.Logger
	nodes  nodeTable // other nodes' figures
}

func (y *sysFigures) localFigures() nodeFigures {
	i := y.mochi.info
	return nodeFigures{
		Node:             y.node.NodeID(),
		ClientsConnected: atomic.LoadInt64(&i.ClientsConnected),
		Sessions:         int64(y.mochi.clients.Len()),
		Subscriptions:    atomic.LoadInt64(&i.Subscriptions),
		MessagesReceived: atomic.LoadInt64(&i.MessagesReceived) - int64(y.stats.Injected.Load()), // from clients only
		MessagesSent:     atomic.LoadInt64(&i.MessagesSent),
		Inflight:         atomic.LoadInt64(&i.Inflight),
	}
}

// nodeTable owns the figures other nodes sent, by node id; it needs
// nothing of NATS or mochi (times are given).
type nodeTable struct {
	mu    sync.Mutex
	nodes map[string]nodeFigures
}

// heard records a node's figures as sent (JSON), at now; malformed ones and
// ones without a node id are ignored.
func (t *nodeTable) heard(data []byte, now time.Time) {
	var f nodeFigures
	if json.Unmarshal(data, &f) != nil || f.Node == "" {
		return
	}
	f.At = now
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nodes == nil {
		t.nodes = map[string]nodeFigures{}
	}
	t.nodes[f.Node] = f
}

// figures returns local then the figures of every node heard from within
// nodeStale of now, sorted by node id, forgetting the others.
func (t *nodeTable) figures(local nodeFigures, now time.Time) []nodeFigures {
	out := []nodeFigures{local}
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, f := range t.nodes {
		if now.Sub(f.At) > nodeStale {
			delete(t.nodes, id)
			continue
		}
		out = append(out, f)
	}
	slices.SortFunc(out[1:], func(a, b nodeFigures) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// figures returns the figures of every node heard from recently, this one
// first.
func (y *sysFigures) figures(now time.Time) []nodeFigures {
	return y.nodes.figures(y.localFigures(), now)
}

// sysLoop sends this node's figures to the others and publishes the
// cluster totals as retained $SYS topics on this node:
//
//	$SYS/broker/cluster/node             this node's id
//	$SYS/cluster/nodes                   nodes heard from in the last 10 s
//	$SYS/cluster/clients/connected       and the sums over them of
//	$SYS/cluster/sessions                mochi's figures of the same names
//	$SYS/cluster/subscriptions
//	$SYS/cluster/messages/received
//	$SYS/cluster/messages/sent
//	$SYS/cluster/messages/inflight
func (y *sysFigures) loop(stop <-chan struct{}) {
	t := time.NewTicker(sysInterval)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
		y.tick(time.Now())
	}
}

// tick sends this node's figures and publishes the totals at now.
func (y *sysFigures) tick(now time.Time) {
	local := y.localFigures()
	if data, err := json.Marshal(local); err == nil {
		_ = y.node.PublishNodeStats(data)
	}
	var sum nodeFigures
	all := y.figures(now)
	for _, f := range all {
		sum.ClientsConnected += f.ClientsConnected
		sum.Sessions += f.Sessions
		sum.Subscriptions += f.Subscriptions
		sum.MessagesReceived += f.MessagesReceived
		sum.MessagesSent += f.MessagesSent
		sum.Inflight += f.Inflight
	}
	for _, v := range []struct {
		topic string
		value string
	}{
		{"$SYS/broker/cluster/node", local.Node},
		{"$SYS/cluster/nodes", strconv.Itoa(len(all))},
		{"$SYS/cluster/clients/connected", strconv.FormatInt(sum.ClientsConnected, 10)},
		{"$SYS/cluster/sessions", strconv.FormatInt(sum.Sessions, 10)},
		{"$SYS/cluster/subscriptions", strconv.FormatInt(sum.Subscriptions, 10)},
		{"$SYS/cluster/messages/received", strconv.FormatInt(sum.MessagesReceived, 10)},
		{"$SYS/cluster/messages/sent", strconv.FormatInt(sum.MessagesSent, 10)},
		{"$SYS/cluster/messages/inflight", strconv.FormatInt(sum.Inflight, 10)},
	} {
		y.publishSys(v.topic, v.value)
	}
}

// publishSys publishes a retained $SYS message on this node only.
func (y *sysFigures) publishSys(topic, value string) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true},
		TopicName:   topic,
		Payload:     []byte(value),
	}
	if err := y.inject.InjectPacket(y.inline, pk); err != nil {
		y.log().Debug("cluster: $SYS publish", "topic", topic, "error", err)
		return
	}
	y.stats.Injected.Add(1)
}
