package broker

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/broker/ops"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/connq"
)

// opsView is the broker as the operator surface (package ops) sees it: its
// figures, clients and groups, read from mochi, the hooks and the stores.
type opsView struct{ b *Broker }

var _ ops.Broker = opsView{}

// newOps assembles the operator surface of b.
func (b *Broker) newOps() *ops.Service {
	return ops.New(opsView{b}, ops.Config{
		Token:        b.cfg.HTTPToken,
		AllowedHosts: b.cfg.HTTPAllowedHosts,
		TopicReader:  b.topicReader,
		Waiting: func(r *http.Request) func() {
			if b.httpConns == nil {
				return func() {}
			}
			return b.httpConns.waitingFor(r) // a request waiting for its token check may give way
		},
		Pprof:      b.cfg.Pprof,
		Settings:   b.cfg.settingsView,
		Collectors: append(b.clusterCollectors(), bridgeCollector{b}, identityCollector{b}, rateCollector{b}),
		Routes: func(mux *http.ServeMux) {
			b.registerCluster(mux)
			b.registerBackup(mux)
			b.registerReload(mux)
		},
		Logger: b.log,
	})
}

// errStreamNeedsAuth refuses the topic stream of a broker whose ACL it could
// bypass.
var errStreamNeedsAuth = errors.New("the topic stream is off: with an auth ledger it needs --http-token (the token holder sees every topic) or http-topic-user (the stream shows what that user may read)")

// topicReader says which topics a topic stream may show (nil: all): with no
// auth ledger every topic (every client may read them over MQTT too); with
// one, what http-topic-user may read, else every topic for a holder of the
// http token, and with neither the stream is refused.
func (b *Broker) topicReader() (func(topic string) bool, error) {
	switch user := b.cfg.HTTPTopicUser; {
	case b.cfg.Auth == nil:
		return nil, nil
	case user != "":
		return func(topic string) bool { return b.auth.UserCanRead(user, topic) }, nil
	case b.cfg.HTTPToken != "":
		return nil, nil
	}
	return nil, errStreamNeedsAuth
}

// settingsView is group name's dispatcher settings, as the admin API shows them.
func (c *Config) settingsView(name string) adminapi.GroupSettingsView {
	s := c.settingsFor(name)
	v := adminapi.GroupSettingsView{
		AckTimeout: s.AckTimeout.String(), MaxDeliveries: s.MaxDeliveries, PoisonPolicy: s.PoisonPolicy.String(),
		MemberMaxInflight: s.MemberMaxInflight, Window: s.Window,
	}
	for _, d := range s.RetryBackoff {
		v.RetryBackoff = append(v.RetryBackoff, d.String())
	}
	return v
}

func (v opsView) Groups() ops.Groups { return v.b.keyShared }

func (v opsView) Bridges() []adminapi.BridgeView { return v.b.BridgeViews() }

func (v opsView) NotReady() error { return v.b.NotReady() }

func (v opsView) Figures() ops.Figures {
	b := v.b
	i := b.server.Info
	load := func(p *int64) int64 { return atomic.LoadInt64(p) }
	f := ops.Figures{
		ClientsConnected: load(&i.ClientsConnected), ClientsMaximum: load(&i.ClientsMaximum),
		Sessions:         int64(b.server.Clients.Len()),
		MessagesReceived: load(&i.MessagesReceived), MessagesSent: load(&i.MessagesSent),
		MessagesDropped: load(&i.MessagesDropped), InflightDropped: load(&i.InflightDropped),
		PacketsReceived: load(&i.PacketsReceived), PacketsSent: load(&i.PacketsSent),
		BytesReceived: load(&i.BytesReceived), BytesSent: load(&i.BytesSent),
		Retained: int64(b.server.Topics.Retained.Len()), Inflight: load(&i.Inflight), Subscriptions: load(&i.Subscriptions),
		SessionCommits: b.sessions.Commits(), SessionWriteErrors: b.sessions.WriteErrors(),
		DataFile: b.db.Path(),
	}
	if fo := b.fanout; fo != nil {
		f.FanoutDeliveries, f.FanoutEncodes = fo.Stats.Deliveries.Load(), fo.Stats.Encodes.Load()
		f.FanoutTooLarge, f.FanoutTracked = fo.Stats.TooLarge.Load(), fo.Stats.Tracked.Load()
		f.OutboxResent, f.OutboxExpired, f.OutboxStoreRefused = fo.OutboxStats.Resent.Load(), fo.OutboxStats.Expired.Load(), fo.Stats.StoreRefused.Load()
		f.OutboxQueuedBytes, f.OutboxColdBytes = fo.OutboxStats.Bytes.Load(), fo.OutboxStats.ColdBytes.Load()
		if sp := fo.Spill(); sp != nil {
			f.OutboxSpilledBytes, f.OutboxSpilled = sp.Bytes.Load(), sp.Spilled.Load()
		}
	}
	if a := b.auth; a != nil {
		f.ReservedRefused, f.TakeoversRefused = a.ReservedRefused.Load(), a.Refused.Load()
		f.WillsRefused = a.WillsRefused.Load()
	}
	if cs := b.connStats; cs != nil {
		f.ConnDroppedMessages, f.ConnDroppedBytes = cs.DroppedMessages.Load(), cs.DroppedBytes.Load()
		f.ConnConflated, f.ConnDropSignals = cs.Conflated.Load(), cs.DropSignals.Load()
		f.ConnSlowDisconnects, f.ConnProtocolErrors = cs.SlowDisconnects.Load(), cs.ProtocolErrors.Load()
		f.ConnAbandonedHolds = cs.AbandonedHolds.Load()
		f.ConnWrites, f.ConnFrames = cs.Writes.Load(), cs.Frames.Load()
	}
	if p := b.poller; p != nil {
		ps := p.Stats()
		f.PollerEvents, f.PollerRuns, f.PollerReads = ps.Events.Load(), ps.Runs.Load(), ps.Reads.Load()
		f.PollerWaitersStarted, f.PollerRescues = ps.Spawned.Load(), ps.Rescues.Load()
	}
	st := b.db.LogStats() // zero in a cluster: its groups' logs are JetStream's
	f.LogCommits, f.LogSyncs, f.LogAppends, f.LogCommitWaits, f.LogSparseCommits = st.Commits, st.Syncs, st.Appends, st.CommitWaits, st.SparseCommits
	f.LogResolveCommits, f.LogWriteTime = st.ResolveCommits, st.WriteTime
	if ks := b.keyShared; ks != nil {
		f.GroupAppendErrors, f.GroupKeysTooLong = ks.AppendErrors.Load(), ks.KeysTooLong.Load()
		f.GroupSubscriptionsRefused, f.GroupResultsDropped = ks.GroupsRefused.Load(), ks.ResultsDropped.Load()
	}
	return f
}

func (v opsView) Retained(filter string) []ops.Message {
	var out []ops.Message
	for _, pk := range v.b.server.Topics.Messages(filter) {
		out = append(out, ops.Message{Topic: pk.TopicName, QoS: pk.FixedHeader.Qos, Payload: pk.Payload})
	}
	return out
}

// Clients lists the clients the broker knows, connected or holding a
// persistent session, sorted by id.
func (v opsView) Clients() []adminapi.ClientView {
	var out []adminapi.ClientView
	for _, cl := range v.b.server.Clients.GetAll() {
		if cl.Net.Inline {
			continue
		}
		out = append(out, v.viewOf(cl))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// viewOf is what the admin API shows of cl. Inflight counts the session's
// QoS 1/2 messages, queued or unacknowledged: its outbox and what mochi
// tracks itself (retained messages sent on subscribe, Key-Shared deliveries).
func (v opsView) viewOf(cl *mqtt.Client) adminapi.ClientView {
	held, _, _ := v.b.fanout.Outbox(cl.ID, 0)
	cv := adminapi.ClientView{
		ID: cl.ID, Listener: cl.Net.Listener, Remote: cl.Net.Remote,
		ProtocolVersion: cl.Properties.ProtocolVersion, Connected: !cl.Closed(),
		Subscriptions: cl.State.Subscriptions.Len(), Inflight: cl.State.Inflight.Len() + held,
		Node: v.b.NodeID(),
	}
	r := v.b.rates.Rates(cl, time.Now())
	cv.MessagesInPerSec, cv.BytesInPerSec, cv.ThrottledSeconds = r.MessagesPerSec, r.BytesPerSec, r.Throttled.Seconds()
	if q, ok := cl.Net.Conn.(*connq.Conn); ok {
		cv.QueuedBytes = q.Queued()
		cv.DroppedMessages, cv.DroppedBytes = q.Dropped()
		cv.ConflatedMessages = q.Conflated()
		l := q.Limits()
		cv.SlowPolicy, cv.QueueSoft, cv.QueueHard = l.Policy.String(), l.Soft, l.Hard
	}
	return cv
}

// client returns the client with id, leaving out the broker's inline clients.
func (v opsView) client(id string) (*mqtt.Client, error) {
	cl, ok := v.b.server.Clients.Get(id)
	if !ok || cl.Net.Inline {
		return nil, &adminapi.StatusError{Status: http.StatusNotFound, Message: fmt.Sprintf("no client with id %q", id)}
	}
	return cl, nil
}

// Client returns a client's view, subscriptions and QoS 1/2 messages.
func (v opsView) Client(id string) (adminapi.ClientDetail, error) {
	cl, err := v.client(id)
	if err != nil {
		return adminapi.ClientDetail{}, err
	}
	d := adminapi.ClientDetail{
		ClientView: v.viewOf(cl), Username: string(cl.Properties.Username),
		KeepAlive: cl.State.Keepalive, Clean: cl.Properties.Clean,
		SubscriptionList: []adminapi.SubscriptionView{}, InflightMessages: []adminapi.InflightView{},
	}
	for _, s := range cl.State.Subscriptions.GetAll() {
		d.SubscriptionList = append(d.SubscriptionList, adminapi.SubscriptionView{
			Filter: s.Filter, QoS: s.Qos, NoLocal: s.NoLocal, RetainAsPublished: s.RetainAsPublished,
			RetainHandling: s.RetainHandling, Identifier: s.Identifier,
		})
	}
	sort.Slice(d.SubscriptionList, func(i, j int) bool { return d.SubscriptionList[i].Filter < d.SubscriptionList[j].Filter })
	add := func(iv adminapi.InflightView) bool {
		if len(d.InflightMessages) == adminapi.MaxClientInflight {
			d.InflightTruncated = true
			return false
		}
		d.InflightMessages = append(d.InflightMessages, iv)
		return true
	}
	// What mochi tracks itself (retained messages sent on subscribe,
	// Key-Shared deliveries), sorted as it cannot keep an order...
	var mochis []adminapi.InflightView
	for _, pk := range cl.State.Inflight.GetAll(false) {
		if pk.FixedHeader.Type != packets.Publish {
			continue // a PUBREC/PUBREL step of a QoS 2 flow, or a reserved id
		}
		mochis = append(mochis, adminapi.InflightView{PacketID: pk.PacketID, Topic: pk.TopicName, QoS: pk.FixedHeader.Qos,
			PayloadSize: len(pk.Payload), Created: time.Unix(pk.Created, 0)})
	}
	sort.Slice(mochis, func(i, j int) bool {
		a, b := mochis[i], mochis[j]
		return a.Created.Before(b.Created) || (a.Created.Equal(b.Created) && a.PacketID < b.PacketID)
	})
	for _, iv := range mochis {
		if !add(iv) {
			return d, nil
		}
	}
	// ...then the session's outbox, in publish order.
	_, _, queued := v.b.fanout.Outbox(id, adminapi.MaxClientInflight+1)
	for _, m := range queued {
		if !add(adminapi.InflightView{PacketID: m.PacketID, Topic: m.Topic, QoS: m.QoS, PayloadSize: m.Size, Created: time.Unix(m.Created, 0)}) {
			break
		}
	}
	return d, nil
}

// Disconnect ends a connected client's connection (MQTT 5 clients get
// DISCONNECT 0x98, administrative action); its persistent session, if any,
// stays.
func (v opsView) Disconnect(id string) (bool, error) {
	cl, err := v.client(id)
	if err != nil {
		return false, err
	}
	if cl.Closed() {
		return false, &adminapi.StatusError{Status: http.StatusConflict,
			Message: fmt.Sprintf("client %q is not connected (its persistent session stays until it expires)", id)}
	}
	kept := !cl.Properties.Clean
	if cl.Properties.ProtocolVersion == 5 {
		kept = cl.Properties.Props.SessionExpiryInterval > 0
	}
	// The reason code is what DisconnectClient returns: it says nothing failed.
	_ = v.b.server.DisconnectClient(cl, packets.ErrAdministrativeAction)
	return kept, nil
}
