package hooks

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/internal/sessionstate"
	"github.com/keyline-mq/keyline/sessionstore"
)

// Ownership protocol (a CONNECT on node N for client id C):
//
//  1. N reads C's record. If another node O owns it, N asks O to release
//     it (O closes its connection with DISCONNECT 0x8E and drops its copy);
//     a node that is gone has no responders, which counts as released.
//  2. N writes the record with itself as owner, compare-and-set on the
//     revision it read. If the write is refused, someone else wrote in
//     between: N starts over (a few times, then refuses the CONNECT).
//  3. N announces the new owner, with the revision it wrote, to every
//     node; one that still holds an older copy of C (it missed step 1)
//     drops it. Requests and announcements carry revisions, and a copy
//     newer than theirs is kept: they may arrive late. Any later write by
//     the old owner fails its compare-and-set, and it drops C too. One
//     that arrives while N is between its write and taking the copy in
//     (sessionTable) and covers N's revision means N lost: its CONNECT
//     is refused.
//  4. A persistent session N did not hold in memory is rebuilt from the
//     record: its filters join N's interest and its subscriptions mochi's
//     index (under a placeholder client, which mochi resumes the session
//     from, session present, as from its own store) first, so it takes
//     every message from then on; then every KL_MSGS message above the
//     record's floor that its subscriptions take is queued again, in
//     order, ahead of those.

// maxAcked bounds the acknowledged sequences a record lists above its floor.
const maxAcked = 4096

// A session record's State holds the session's client, its subscriptions
// with where each starts in KL_MSGS (Since: older messages are not for it)
// the key filters of its shared subscriptions (KeyFilterStore) and the
// connection's will while it may still be sent (a node that finds the
// owner gone publishes it, cluster_wills.go), in one node's codec,
// internal/sessionstate (DecodeCluster also reads the JSON older releases
// wrote).

// clusterSession is one copy of a session this node holds: one
// connection's (client never changes) and the record revisions written for
// it. The sessionTable says whether it is the installed copy.
type clusterSession struct {
	id         string
	client     *mqtt.Client // the mochi client holding it
	persistent atomic.Bool
	released   atomic.Bool   // dropped: another node took it over, or a newer copy replaced it
	replayedTo atomic.Uint64 // queued messages up to here came through the replay

	mu       sync.Mutex
	rev      uint64                      // record revision last read or written
	rec      sessionstore.Record         // as last written
	subs     map[string]sessionstate.Sub // persistent sessions: filter -> subscription
	kf       map[string][]string         // persistent sessions: shared subscription filter -> key filters
	filters  map[string]bool             // filters registered with the node's interest
	since    map[string]uint64           // filter -> last KL_MSGS sequence when it was subscribed
	maxSince uint64                      // the highest of since
	// live holds the KL_MSGS sequences of the messages in the session's
	// outbox (queued or in flight), by outbox sequence: the floor stays
	// below them (clusterOutboxes keeps it).
	live  map[uint64]uint64
	acked []uint64 // acknowledged sequences above rec.Floor
	dirty bool     // acks not written yet
	// will is the connection's will until it is sent or discarded (nil:
	// none), as the record carries it.
	will *storedWill
	// capped: the floor may not pass floorCap. A copy rebuilt from its
	// record is capped at the record's floor until its queued messages
	// are in its outbox (restore): before that nothing in the copy holds
	// them, and a record written meanwhile (another node's release
	// request, a disconnect) would have put the floor above them all.
	// A replay that failed leaves the cap at the last message it handled.
	capped   bool
	floorCap uint64
}

func newClusterSession(id string, cl *mqtt.Client, persistent bool) *clusterSession {
	s := &clusterSession{id: id, client: cl, subs: map[string]sessionstate.Sub{}, kf: map[string][]string{}, filters: map[string]bool{}, since: map[string]uint64{}, live: map[uint64]uint64{}}
	s.persistent.Store(persistent)
	return s
}

// revision returns the record revision the copy last read or wrote.
func (s *clusterSession) revision() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev
}

// inherit moves what prev holds for the session that mochi and the
// fan-out keep in memory across the new connection (its subscriptions, the
// node interest they hold, the references of its outbox's messages and the
// acknowledged ones) into s, a fresh copy for that connection; prev is
// dropped. Call it once s is installed in prev's place: from then on the
// outbox reports to s, so what it reported meanwhile is merged, not replaced.
func (s *clusterSession) inherit(prev *clusterSession) {
	prev.released.Store(true)
	prev.mu.Lock()
	subs, kf, filters, since, maxSince, live, acked, dirty := prev.subs, prev.kf, prev.filters, prev.since, prev.maxSince, prev.live, prev.acked, prev.dirty
	capped, floorCap := prev.capped, prev.floorCap // a restore of prev still running: its replay is not in live yet
	prev.subs, prev.kf, prev.filters, prev.since, prev.live, prev.acked = map[string]sessionstate.Sub{}, map[string][]string{}, map[string]bool{}, map[string]uint64{}, map[uint64]uint64{}, nil
	prev.mu.Unlock()
	s.replayedTo.Store(max(s.replayedTo.Load(), prev.replayedTo.Load()))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subs, s.kf, s.filters, s.since, s.maxSince = subs, kf, filters, since, maxSince
	for seq, ref := range s.live {
		live[seq] = ref
	}
	s.live, s.acked = live, append(acked, s.acked...)
	s.dirty = s.dirty || dirty
	if capped {
		s.capped, s.floorCap = true, floorCap
	}
}

func storedClient(cl *mqtt.Client) storage.Client {
	props := cl.Properties.Props.Copy()
	return storage.Client{
		ID: cl.ID, T: storage.ClientKey, Remote: cl.Net.Remote, Listener: cl.Net.Listener,
		Username: cl.Properties.Username, Clean: cl.Properties.Clean, ProtocolVersion: cl.Properties.ProtocolVersion,
		Properties: storage.ClientProperties{
			SessionExpiryInterval: props.SessionExpiryInterval, SessionExpiryIntervalFlag: props.SessionExpiryIntervalFlag,
			RequestProblemInfo: props.RequestProblemInfo, RequestProblemInfoFlag: props.RequestProblemInfoFlag,
			RequestResponseInfo: props.RequestResponseInfo, ReceiveMaximum: props.ReceiveMaximum,
			TopicAliasMaximum: props.TopicAliasMaximum, User: props.User, MaximumPacketSize: props.MaximumPacketSize,
		},
	}
}

// stateLocked encodes the session's client, subscriptions, key filters and
// will.
func (s *clusterSession) stateLocked() []byte {
	st := sessionstate.State{Client: storedClient(s.client), Subs: make([]sessionstate.Sub, 0, len(s.subs))}
	s.will.put(&st)
	for _, sub := range s.subs {
		st.Subs = append(st.Subs, sub)
	}
	if len(s.kf) > 0 {
		st.KeyFilters = s.kf
	}
	slices.SortFunc(st.Subs, func(a, b sessionstate.Sub) int { return strings.Compare(a.Filter, b.Filter) })
	return sessionstate.Encode(nil, &st)
}

// sessionNode is what the session owner needs of the cluster node.
type sessionNode interface {
	NodeID() string
	// LastSequence is the last KL_MSGS sequence.
	LastSequence(ctx context.Context) (uint64, error)
	// RequestRelease asks owner to drop its copy of clientID (at or below
	// record revision rev).
	RequestRelease(ctx context.Context, owner, clientID string, rev uint64) error
	// Announce tells every node that this one owns clientID at rev.
	Announce(clientID string, rev uint64)
	// Replay calls fn with every KL_MSGS message above after that filters
	// match, in order; it returns the last sequence it covered.
	Replay(ctx context.Context, filters []string, after uint64, fn func(seq uint64, body []byte)) (uint64, error)
}

// sessionOwner runs the ownership protocol: it takes sessions over from
// other nodes (acquire, restore), gives them up when asked (release) and
// ends them (forget). What it owns is the connections refused meanwhile;
// the copies are the table's, their records the writer's and their node
// interest the interest's.
type sessionOwner struct {
	node     sessionNode        // set by Cluster.SetNode
	records  sessionstore.Store // set by Cluster.SetNode
	server   *mqtt.Server
	table    *sessionTable
	interest *interest
	writer   *recordWriter
	// run is this run of the node (the wills in records carry it).
	run string
	// outboxes returns the fan-out's session outboxes (nil: none).
	outboxes func() SessionOutboxes
	// moved is told the id of a client whose session another node took
	// over, once this node has dropped its copy (Cluster.Moved).
	moved func(clientID string)
	// stopping ends takeovers in progress (Cluster.Stopping).
	stopping context.Context
	stats    *ClusterStats
	log      func() *slog.Logger

	// refused holds the connections whose session ownership could not be
	// settled, until their CONNACK (a refusal) is out.
	refused sync.Map // *mqtt.Client -> struct{}
}

// establish takes the session over from wherever it was (see the
// ownership protocol above) before mochi looks for a local one. If the
// cluster cannot settle ownership the CONNECT is refused (OnPacketEncode
// turns the CONNACK into 0x88).
func (o *sessionOwner) establish(cl *mqtt.Client, pk packets.Packet) {
	ctx, cancel := context.WithTimeout(o.stopping, 20*time.Second)
	defer cancel()
	s, restore, err := o.acquire(ctx, cl, pk.Connect.Clean)
	if err != nil {
		o.log().Warn("cluster: refusing a connection: session ownership not settled", "client", cl.ID, "error", err)
		o.stats.Refused.Add(1)
		o.refused.Store(cl, struct{}{})
		// Make mochi forget this client when it goes: it holds no session.
		cl.Properties.Clean = true
		cl.Properties.Props.SessionExpiryInterval = 0
		return
	}
	if restore != nil {
		o.restore(ctx, cl, s, restore)
	}
}

// acquire runs steps 1-3 of the ownership protocol. It returns the record
// to rebuild the session from when the session must be restored.
func (o *sessionOwner) acquire(ctx context.Context, cl *mqtt.Client, clean bool) (*clusterSession, *sessionstore.Record, error) {
	self := o.node.NodeID()
	id := cl.ID
	persist := persistent(cl)
	o.table.begin(id)
	defer o.table.end(id)
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(attempt*attempt) * 20 * time.Millisecond):
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		rec, rev, err := o.records.Load(ctx, id)
		if errors.Is(err, sessionrec.ErrCorrupt) {
			// Retrying cannot read it: the session starts anew over it
			// (the Save below is at its revision), as a lost one would.
			o.log().Error("cluster: replacing a session record that cannot be decoded", "client", id, "error", err)
			rec, err = nil, nil
		}
		if err != nil {
			lastErr = err
			continue
		}
		if rec != nil && rec.Owner != self {
			if err := o.node.RequestRelease(ctx, rec.Owner, id, rev); err != nil {
				o.log().Warn("cluster: the previous owner did not confirm the release", "client", id, "owner", rec.Owner, "error", err)
			}
		}
		prev := o.table.get(id)
		keepLocal := !clean && prev != nil && rec != nil && rec.Owner == self && rec.Persistent
		var restore *sessionstore.Record
		s := newClusterSession(id, cl, persist)
		s.will = willOf(cl, o.run)
		nr := sessionstore.Record{ClientID: id, Owner: self, Persistent: persist, Connected: true}
		switch {
		case keepLocal: // mochi holds it in memory and resumes it
			prev.mu.Lock()
			nr.Floor, nr.Acked = prev.rec.Floor, prev.acked
			for f, sub := range prev.subs {
				s.subs[f] = sub // for the state written below; inherit moves the rest
			}
			for f, kf := range prev.kf {
				s.kf[f] = kf
			}
			prev.mu.Unlock()
		case !clean && rec != nil && rec.Persistent:
			restore = rec
			nr.Floor, nr.Acked, nr.State = rec.Floor, rec.Acked, withWill(rec.State, s.will)
		default:
			if persist {
				if nr.Floor, err = o.node.LastSequence(ctx); err != nil {
					lastErr = err
					continue
				}
			}
		}
		s.mu.Lock()
		if restore == nil {
			nr.State = s.stateLocked()
		} else {
			s.capped, s.floorCap = true, nr.Floor // until restore has queued what is above it
		}
		s.mu.Unlock()
		nrev, err := o.records.Save(ctx, &nr, rev)
		if errors.Is(err, sessionstore.ErrRevision) {
			lastErr = err
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		s.mu.Lock()
		s.rev, s.rec, s.dirty = nrev, nr, false
		s.mu.Unlock()
		switch err := o.table.install(s, prev); {
		case errors.Is(err, errTableChanged):
			lastErr = err
			continue // prev was released or replaced meanwhile: look again
		case err != nil:
			return nil, nil, err // another node took the session after this write
		}
		if keepLocal {
			s.inherit(prev)
		} else if prev != nil {
			o.interest.drop(prev) // mochi discards or replaces the local copy
		}
		if rec != nil && rec.Owner != self {
			o.node.Announce(id, nrev)
		}
		return s, restore, nil
	}
	return nil, nil, lastErr
}

// dropLocal forgets a local client and its session without touching the
// record (another node owns it).
func (o *sessionOwner) dropLocal(cl *mqtt.Client) {
	o.server.CancelDelayedWill(cl) // the session goes on elsewhere [MQTT-3.1.3-9]
	if !cl.Closed() {
		_ = o.server.DisconnectClient(cl, packets.ErrSessionTakenOver)
	}
	o.server.UnsubscribeClient(cl)
	cl.ClearInflights()
	if cur, ok := o.server.Clients.Get(cl.ID); ok && cur == cl {
		o.server.Clients.Delete(cl.ID)
	}
}

// release drops this node's copy of a client's session: another node is
// taking it over. A connected client gets DISCONNECT 0x8E, and the record
// gets the session's last progress first, so the next owner does not
// resend what the client has acknowledged here.
//
// A copy newer than upTo stays: a late announcement or a request that lost
// a race must not drop a session taken over since.
func (o *sessionOwner) release(clientID string, upTo uint64) {
	s, newer := o.table.claim(clientID, upTo)
	if newer {
		return
	}
	if s == nil {
		// No copy here: a stale client mochi still holds under the id goes
		// (a connection that is being acquired is not in mochi's list yet).
		if cl, ok := o.server.Clients.Get(clientID); ok {
			o.dropLocal(cl)
			o.movedAway(clientID)
		}
		return
	}
	if s.persistent.Load() {
		if !s.client.Closed() {
			_ = o.server.DisconnectClient(s.client, packets.ErrSessionTakenOver)
		}
		s.mu.Lock()
		s.rec.Connected = false
		s.rec.DisconnectedAt = time.Now().Unix()
		s.will = nil // cancelled, or (no delay) sent as the connection closed
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		o.writer.write(ctx, s, true)
		cancel()
	}
	o.dropCopy(s)
}

// dropCopy forgets s, a copy already uninstalled, without writing its
// record: its interest, and its connection if mochi still holds it.
func (o *sessionOwner) dropCopy(s *clusterSession) {
	o.server.CancelDelayedWill(s.client) // the session goes on elsewhere [MQTT-3.1.3-9]
	o.interest.drop(s)
	if out := o.outboxes(); out != nil {
		out.DropSession(s.id) // what it queued is another node's now
	}
	if cl, ok := o.server.Clients.Get(s.id); ok && cl == s.client {
		o.dropLocal(cl)
	} else if !s.client.Closed() {
		_ = o.server.DisconnectClient(s.client, packets.ErrSessionTakenOver)
	}
	o.movedAway(s.id)
}

// movedAway tells moved that another node took over the session of id,
// unless this node holds a newer copy of it meanwhile.
func (o *sessionOwner) movedAway(id string) {
	if o.moved != nil && o.table.get(id) == nil {
		o.moved(id)
	}
}

// encodePacket (the cluster hook's PacketEncoder step) turns the CONNACK of a connection
// whose session ownership could not be settled into a refusal.
func (o *sessionOwner) encodePacket(cl *mqtt.Client, pk *packets.Packet) {
	if pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != 0 {
		return
	}
	if _, refused := o.refused.Load(cl); refused {
		pk.SessionPresent = false
		pk.ReasonCode = packets.ErrServerUnavailable.Code
		if cl.Properties.ProtocolVersion < 5 {
			pk.ReasonCode = packets.Err3ServerUnavailable.Code
		}
	}
}

// packetSent closes a refused connection once its CONNACK is out.
func (o *sessionOwner) packetSent(cl *mqtt.Client, pk packets.Packet) {
	if pk.FixedHeader.Type == packets.Connack && pk.ReasonCode >= packets.Err3ServerUnavailable.Code {
		if _, refused := o.refused.LoadAndDelete(cl); refused {
			cl.Stop(packets.ErrServerUnavailable)
		}
	}
}

// disconnect writes a persistent session's state as it goes offline, or
// deletes the record of a session that ends with its connection.
func (o *sessionOwner) disconnect(cl *mqtt.Client, err error, expire bool) {
	o.refused.Delete(cl) // its CONNACK may never have gone out
	s := o.table.current(cl)
	if s == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if expire {
		o.forget(ctx, s)
		return
	}
	s.mu.Lock()
	s.rec.Connected = false
	s.rec.DisconnectedAt = time.Now().Unix()
	if err == nil {
		s.will = nil // a normal DISCONNECT discards it [MQTT-3.1.2-10]
	}
	s.mu.Unlock()
	o.writer.flush(ctx, s, true)
}

// expired deletes an expired session's record.
func (o *sessionOwner) expired(cl *mqtt.Client) {
	if s := o.table.current(cl); s != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		o.forget(ctx, s)
	}
}

// forget ends a session: its copy, interest and record.
func (o *sessionOwner) forget(ctx context.Context, s *clusterSession) {
	if !o.table.remove(s) {
		return // replaced or released meanwhile: the record is someone else's
	}
	o.interest.drop(s)
	s.mu.Lock()
	rev := s.rev
	s.mu.Unlock()
	if err := o.records.Delete(ctx, s.id, rev); err != nil && !errors.Is(err, sessionstore.ErrRevision) {
		o.stats.RecordErrors.Add(1)
		o.log().Warn("cluster: session record not deleted", "client", s.id, "error", err)
	}
}

// saveSubscriptions records added and removed subscriptions of a
// persistent session before its SUBACK/UNSUBACK.
func (w *recordWriter) saveSubscriptions(ctx context.Context, s *clusterSession, added []packets.Subscription, since uint64, removed []string) {
	s.mu.Lock()
	for _, f := range added {
		old, existed := s.subs[f.Filter]
		sub := sessionstate.Sub{Subscription: storage.Subscription{
			ID: f.Filter, T: storage.SubscriptionKey, Client: s.id, Filter: f.Filter, Qos: f.Qos,
			Identifier: f.Identifier, NoLocal: f.NoLocal, RetainHandling: f.RetainHandling, RetainAsPublished: f.RetainAsPublished,
		}, Since: since}
		if existed {
			sub.Since = old.Since
		}
		s.subs[f.Filter] = sub
	}
	for _, f := range removed {
		delete(s.subs, f)
	}
	s.dirty = true
	s.mu.Unlock()
	w.flush(ctx, s, true)
}
