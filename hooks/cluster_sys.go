package hooks

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
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

func (h *Cluster) localFigures() nodeFigures {
	i := h.server.Info
	return nodeFigures{
		Node:             h.node.NodeID(),
		ClientsConnected: atomic.LoadInt64(&i.ClientsConnected),
		Sessions:         int64(h.server.Clients.Len()),
		Subscriptions:    atomic.LoadInt64(&i.Subscriptions),
		MessagesReceived: atomic.LoadInt64(&i.MessagesReceived) - int64(h.Stats.Injected.Load()), // from clients only
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

func (h *Cluster) nodeStats(data []byte) { h.nodes.heard(data, time.Now()) }

// ClusterFigures returns the figures of every node heard from recently,
// this one first.
func (h *Cluster) ClusterFigures() []nodeFigures {
	return h.nodes.figures(h.localFigures(), time.Now())
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
func (h *Cluster) sysLoop() {
	t := time.NewTicker(sysInterval)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
		local := h.localFigures()
		if data, err := json.Marshal(local); err == nil {
			_ = h.node.PublishNodeStats(data)
		}
		var sum nodeFigures
		all := h.ClusterFigures()
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
			h.publishSys(v.topic, v.value)
		}
	}
}

// publishSys publishes a retained $SYS message on this node only.
func (h *Cluster) publishSys(topic, value string) {
	pk := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true},
		TopicName:   topic,
		Payload:     []byte(value),
	}
	if err := h.server.InjectPacket(h.inlineSys, pk); err != nil {
		h.Log.Debug("cluster: $SYS publish", "topic", topic, "error", err)
		return
	}
	h.Stats.Injected.Add(1)
}
