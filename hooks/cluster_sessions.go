package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/storage"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/cluster"
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
//     the old owner fails its compare-and-set, and it drops C too.
//  4. A persistent session N did not hold in memory is rebuilt from the
//     record: its filters join N's interest first, then every KL_MSGS
//     message above the record's floor that its subscriptions take is
//     queued again, in order, and mochi resumes the session (session
//     present) from a placeholder client, as it does from its own store.

// maxAcked bounds the acknowledged sequences a record lists above its floor.
const maxAcked = 4096

// clusterState is what a session record's State holds.
type clusterState struct {
	Client storage.Client `json:"client"`
	Subs   []clusterSub   `json:"subs,omitempty"`
}

// clusterSub is a stored subscription; Since is the last KL_MSGS sequence
// when it was made (older messages are not for it).
type clusterSub struct {
	storage.Subscription
	Since uint64 `json:"since"`
}

// clusterSession is a session this node holds.
type clusterSession struct {
	id         string
	client     atomic.Pointer[mqtt.Client] // the mochi client holding it now
	persistent atomic.Bool
	released   atomic.Bool   // another node took it over
	replayedTo atomic.Uint64 // queued messages up to here came through the replay

	mu       sync.Mutex
	rev      uint64                // record revision last read or written
	rec      cluster.SessionRecord // as last written
	subs     map[string]clusterSub // persistent sessions: filter -> subscription
	filters  map[string]bool       // filters registered with the node's interest
	since    map[string]uint64     // filter -> last KL_MSGS sequence when it was subscribed
	maxSince uint64                // the highest of since
	inflight map[uint16]uint64     // packet id -> KL_MSGS sequence
	acked    []uint64              // acknowledged sequences above rec.Floor
	dirty    bool                  // acks not written yet
	refused  bool                  // the CONNECT could not take ownership
}

func newClusterSession(id string, cl *mqtt.Client, persistent bool) *clusterSession {
	s := &clusterSession{id: id, subs: map[string]clusterSub{}, filters: map[string]bool{}, since: map[string]uint64{}, inflight: map[uint16]uint64{}}
	s.client.Store(cl)
	s.persistent.Store(persistent)
	return s
}

// session returns the session cl holds on this node, nil if none (a
// client taken over, a placeholder, or not a session of ours).
func (h *Cluster) session(cl *mqtt.Client) *clusterSession {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.mu.sessions[cl.ID]
	if s == nil || s.client.Load() != cl || s.released.Load() {
		return nil
	}
	return s
}

func storedClient(cl *mqtt.Client) storage.Client {
	props := cl.Properties.Props.Copy(false)
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

// stateLocked encodes the session's client and subscriptions.
func (s *clusterSession) stateLocked() json.RawMessage {
	st := clusterState{Client: storedClient(s.client.Load())}
	for _, sub := range s.subs {
		st.Subs = append(st.Subs, sub)
	}
	slices.SortFunc(st.Subs, func(a, b clusterSub) int { return strings.Compare(a.Filter, b.Filter) })
	data, _ := json.Marshal(st)
	return data
}

// OnSessionEstablish takes the session over from wherever it was (see the
// ownership protocol above) before mochi looks for a local one. If the
// cluster cannot settle ownership the CONNECT is refused (OnPacketEncode
// turns the CONNACK into 0x88).
func (h *Cluster) OnSessionEstablish(cl *mqtt.Client, pk packets.Packet) {
	if cl.Net.Inline || h.node == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, restore, err := h.acquire(ctx, cl, pk.Connect.Clean)
	if err != nil {
		h.Log.Warn("cluster: refusing a connection: session ownership not settled", "client", cl.ID, "error", err)
		h.Stats.Refused.Add(1)
		s = newClusterSession(cl.ID, cl, false)
		s.refused = true
		h.mu.Lock()
		h.mu.sessions[cl.ID] = s
		h.mu.Unlock()
		// Make mochi forget this client when it goes: it holds no session.
		cl.Properties.Clean = true
		cl.Properties.Props.SessionExpiryInterval = 0
		return
	}
	if restore != nil {
		h.restore(ctx, cl, s, restore)
	}
}

// acquire runs steps 1-3 of the ownership protocol. It returns the record
// to rebuild the session from when the session must be restored.
func (h *Cluster) acquire(ctx context.Context, cl *mqtt.Client, clean bool) (*clusterSession, *cluster.SessionRecord, error) {
	self := h.node.NodeID()
	id := cl.ID
	persist := persistent(cl)
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		if attempt > 0 {
			select {
			case <-time.After(time.Duration(attempt*attempt) * 20 * time.Millisecond):
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		rec, rev, err := h.node.LoadSession(ctx, id)
		if err != nil {
			lastErr = err
			continue
		}
		if rec != nil && rec.Owner != self {
			if err := h.node.RequestRelease(ctx, rec.Owner, id, rev); err != nil {
				h.Log.Warn("cluster: the previous owner did not confirm the release", "client", id, "owner", rec.Owner, "error", err)
			}
		}
		h.mu.Lock()
		prev := h.mu.sessions[id]
		h.mu.Unlock()
		if prev != nil && (prev.released.Load() || prev.refused) {
			prev = nil
		}
		keepLocal := !clean && prev != nil && rec != nil && rec.Owner == self && rec.Persistent
		var restore *cluster.SessionRecord
		var s *clusterSession
		nr := cluster.SessionRecord{ClientID: id, Owner: self, Persistent: persist, Connected: true}
		switch {
		case keepLocal: // mochi holds it in memory and resumes it
			s = prev
			s.mu.Lock()
			nr.Floor, nr.Acked = s.rec.Floor, s.acked
			s.mu.Unlock()
		case !clean && rec != nil && rec.Persistent:
			s = newClusterSession(id, cl, persist)
			restore = rec
			nr.Floor, nr.Acked, nr.State = rec.Floor, rec.Acked, rec.State
		default:
			s = newClusterSession(id, cl, persist)
			if persist {
				if nr.Floor, err = h.node.LastSequence(ctx); err != nil {
					lastErr = err
					continue
				}
			}
		}
		s.mu.Lock()
		s.persistent.Store(persist)
		s.client.Store(cl)
		if restore == nil {
			nr.State = s.stateLocked()
		}
		s.mu.Unlock()
		nrev, err := h.node.SaveSession(ctx, &nr, rev)
		if errors.Is(err, cluster.ErrRevision) {
			lastErr = err
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		s.mu.Lock()
		s.rev, s.rec, s.dirty = nrev, nr, false
		s.mu.Unlock()
		if prev != nil && prev != s {
			h.dropInterest(prev) // mochi discards or replaces the local copy
		}
		h.mu.Lock()
		h.mu.sessions[id] = s
		h.mu.Unlock()
		if rec != nil && rec.Owner != self {
			h.node.Announce(id, nrev)
		}
		return s, restore, nil
	}
	return nil, nil, lastErr
}

// dropInterest forgets a session's filters on the node.
func (h *Cluster) dropInterest(s *clusterSession) {
	s.released.Store(true)
	s.mu.Lock()
	filters := s.filters
	s.filters = map[string]bool{}
	s.mu.Unlock()
	for f := range filters {
		h.node.RemoveInterest(f)
	}
}

// restore rebuilds a persistent session from its record: interest, then
// the replay of its queued messages, then a placeholder client mochi
// resumes the session from.
func (h *Cluster) restore(ctx context.Context, cl *mqtt.Client, s *clusterSession, rec *cluster.SessionRecord) {
	var st clusterState
	if len(rec.State) > 0 {
		if err := json.Unmarshal(rec.State, &st); err != nil {
			h.Log.Error("cluster: unreadable session record; starting the session empty", "client", cl.ID, "error", err)
		}
	}
	if old, ok := h.server.Clients.Get(cl.ID); ok {
		h.dropLocal(old) // a stale local copy
	}
	filters := make([]string, 0, len(st.Subs))
	s.mu.Lock()
	for _, sub := range st.Subs {
		s.subs[sub.Filter] = sub
		s.setSinceLocked(sub.Filter, sub.Since)
		filters = append(filters, sub.Filter)
	}
	s.mu.Unlock()
	h.addInterest(ctx, s, filters...)
	acked := map[uint64]bool{}
	for _, a := range rec.Acked {
		acked[a] = true
	}
	var queued []packets.Packet
	var nextID uint16
	maxInflight := int(h.server.Options.Capabilities.MaximumInflight)
	last, err := h.node.Replay(ctx, filters, rec.Floor, func(seq uint64, body []byte) {
		if acked[seq] {
			return
		}
		pk, err := decodeEnvelope(body)
		if err != nil || !remainingExpiry(&pk, time.Now()) {
			return
		}
		qos, ids, ok := matchSession(st.Subs, pk.TopicName, seq)
		if !ok || min(qos, pk.FixedHeader.Qos) == 0 {
			return
		}
		if len(queued) >= maxInflight {
			atomic.AddInt64(&h.server.Info.InflightDropped, 1)
			return
		}
		nextID++
		pk.FixedHeader.Qos = min(qos, pk.FixedHeader.Qos)
		pk.FixedHeader.Retain = false
		pk.PacketID = nextID
		if cl.Properties.ProtocolVersion == 5 && len(ids) > 0 {
			pk.Properties.SubscriptionIdentifier = ids
		}
		queued = append(queued, pk)
		s.mu.Lock()
		s.inflight[nextID] = seq
		s.mu.Unlock()
	})
	if err != nil {
		h.Log.Error("cluster: replaying a session's queued messages failed; some may be missing", "client", cl.ID, "error", err)
	}
	s.replayedTo.Store(last)
	h.Stats.Restored.Add(uint64(len(queued)))

	ph := h.server.NewClient(nil, cl.Net.Listener, cl.ID, false)
	ph.Properties.ProtocolVersion = cl.Properties.ProtocolVersion
	ph.Properties.Username = cl.Properties.Username
	ph.Properties.Clean = false
	ph.Stop(packets.ErrSessionTakenOver)
	for _, sub := range st.Subs {
		ps := packets.Subscription{
			Filter: sub.Filter, Qos: sub.Qos, NoLocal: sub.NoLocal, RetainAsPublished: sub.RetainAsPublished,
			RetainHandling: sub.RetainHandling, Identifier: sub.Identifier,
		}
		if h.server.Topics.Subscribe(cl.ID, ps) {
			atomic.AddInt64(&h.server.Info.Subscriptions, 1)
		}
		ph.State.Subscriptions.Add(sub.Filter, ps)
	}
	// mochi resends a session's messages sorted by uint16(Created), with
	// ties in any order: give them distinct, increasing values (ending now,
	// and without a wrap of the low 16 bits inside the run).
	start := time.Now().Unix() - int64(len(queued))
	if int64(uint16(start))+int64(len(queued)) > 0xffff {
		start -= int64(uint16(start))
	}
	for i, pk := range queued {
		pk.Created = start + int64(i)
		ph.State.Inflight.Set(pk)
	}
	h.server.Clients.Add(ph)
}

// sincePending marks a filter whose start is not known yet: it takes no
// queued message until it is.
const sincePending = math.MaxUint64

func (s *clusterSession) setSinceLocked(filter string, since uint64) {
	s.since[filter] = since
	s.maxSince = 0
	for _, v := range s.since {
		s.maxSince = max(s.maxSince, v)
	}
}

// takesQueued reports whether a queued message at sequence seq on topic is
// for this session: not replayed to it already, and matching a subscription
// made before it was published (a node's consumer may hand it messages
// published shortly before a new subscription).
func (s *clusterSession) takesQueued(topic string, seq uint64) bool {
	if seq <= s.replayedTo.Load() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq > s.maxSince {
		return true
	}
	for f, since := range s.since {
		if since < seq && topicMatch(f, topic) {
			return true
		}
	}
	return false
}

// matchSession returns the QoS and subscription identifiers with which a
// session's subscriptions take a message at sequence seq.
func matchSession(subs []clusterSub, topic string, seq uint64) (qos byte, ids []int, ok bool) {
	for _, s := range subs {
		if s.Since >= seq || !topicMatch(s.Filter, topic) {
			continue
		}
		ok = true
		qos = max(qos, s.Qos)
		if s.Identifier > 0 {
			ids = append(ids, s.Identifier)
		}
	}
	slices.Sort(ids)
	return qos, ids, ok
}

// topicMatch is MQTT's filter matching (no $share prefix).
func topicMatch(filter, topic string) bool {
	if strings.HasPrefix(topic, "$") && (strings.HasPrefix(filter, "+") || strings.HasPrefix(filter, "#")) {
		return false
	}
	fl, tl := strings.Split(filter, "/"), strings.Split(topic, "/")
	for i, f := range fl {
		if f == "#" {
			return true
		}
		if i >= len(tl) || (f != "+" && f != tl[i]) {
			return false
		}
	}
	return len(fl) == len(tl)
}

// dropLocal forgets a local client and its session without touching the
// record (another node owns it).
func (h *Cluster) dropLocal(cl *mqtt.Client) {
	if !cl.Closed() {
		_ = h.server.DisconnectClient(cl, packets.ErrSessionTakenOver)
	}
	h.server.UnsubscribeClient(cl)
	cl.ClearInflights()
	if cur, ok := h.server.Clients.Get(cl.ID); ok && cur == cl {
		h.server.Clients.Delete(cl.ID)
	}
}

// Release drops this node's copy of a client's session: another node is
// taking it over. A connected client gets DISCONNECT 0x8E, and the record
// gets the session's last progress first, so the next owner does not
// resend what the client has acknowledged here.
//
// A copy newer than upTo stays: a late announcement or a request that lost
// a race must not drop a session taken over since.
func (h *Cluster) Release(clientID string, upTo uint64) {
	h.mu.Lock()
	s := h.mu.sessions[clientID]
	h.mu.Unlock()
	if s != nil {
		s.mu.Lock()
		newer := s.rev > upTo
		s.mu.Unlock()
		if newer {
			return
		}
	}
	if s != nil && s.persistent.Load() && !s.released.Load() {
		if cl := s.client.Load(); cl != nil && !cl.Closed() {
			_ = h.server.DisconnectClient(cl, packets.ErrSessionTakenOver)
		}
		s.mu.Lock()
		s.rec.Connected = false
		s.rec.DisconnectedAt = time.Now().Unix()
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h.flush(ctx, s, true)
		cancel()
	}
	h.releaseLocal(clientID)
}

// releaseLocal drops this node's copy of a session without writing its record.
func (h *Cluster) releaseLocal(clientID string) {
	h.mu.Lock()
	s := h.mu.sessions[clientID]
	delete(h.mu.sessions, clientID)
	h.mu.Unlock()
	if s != nil {
		h.dropInterest(s)
	}
	if cl, ok := h.server.Clients.Get(clientID); ok {
		h.dropLocal(cl)
	}
}

// EncodePacket (a PacketEncoder step) turns the CONNACK of a connection
// whose session ownership could not be settled into a refusal.
func (h *Cluster) EncodePacket(cl *mqtt.Client, pk *packets.Packet) {
	if pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != 0 {
		return
	}
	h.mu.Lock()
	s := h.mu.sessions[cl.ID]
	refused := s != nil && s.refused && s.client.Load() == cl
	h.mu.Unlock()
	if refused {
		pk.SessionPresent = false
		pk.ReasonCode = packets.ErrServerUnavailable.Code
		if cl.Properties.ProtocolVersion < 5 {
			pk.ReasonCode = packets.Err3ServerUnavailable.Code
		}
	}
}

// OnPacketSent closes a refused connection once its CONNACK is out.
func (h *Cluster) OnPacketSent(cl *mqtt.Client, pk packets.Packet, _ []byte) {
	if pk.FixedHeader.Type == packets.Connack && pk.ReasonCode >= packets.Err3ServerUnavailable.Code {
		h.mu.Lock()
		s := h.mu.sessions[cl.ID]
		if s != nil && s.refused && s.client.Load() == cl {
			delete(h.mu.sessions, cl.ID)
		}
		h.mu.Unlock()
		if s != nil && s.refused {
			cl.Stop(packets.ErrServerUnavailable)
		}
	}
}

// OnDisconnect writes a persistent session's state as it goes offline, or
// deletes the record of a session that ends with its connection.
func (h *Cluster) OnDisconnect(cl *mqtt.Client, _ error, expire bool) {
	if h.node == nil || cl.Net.Inline {
		return
	}
	if v, ok := h.pubSeq.Load(cl.ID); ok && cl.Closed() {
		// A publish cut short (its PUBACK could not be written) never
		// reached OnPublished: do not let it hold every floor back.
		h.pubSeq.CompareAndDelete(cl.ID, v)
	}
	s := h.session(cl)
	if s == nil || s.refused {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if expire {
		h.forget(ctx, s)
		return
	}
	s.mu.Lock()
	s.rec.Connected = false
	s.rec.DisconnectedAt = time.Now().Unix()
	s.mu.Unlock()
	h.flush(ctx, s, true)
}

// OnClientExpired deletes an expired session's record.
func (h *Cluster) OnClientExpired(cl *mqtt.Client) {
	if s := h.session(cl); s != nil && h.node != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		h.forget(ctx, s)
	}
}

// forget ends a session: interest, map entry and record.
func (h *Cluster) forget(ctx context.Context, s *clusterSession) {
	h.dropInterest(s)
	h.mu.Lock()
	if h.mu.sessions[s.id] == s {
		delete(h.mu.sessions, s.id)
	}
	h.mu.Unlock()
	s.mu.Lock()
	rev := s.rev
	s.mu.Unlock()
	if err := h.node.DeleteSession(ctx, s.id, rev); err != nil && !errors.Is(err, cluster.ErrRevision) {
		h.Stats.RecordErrors.Add(1)
		h.Log.Warn("cluster: session record not deleted", "client", s.id, "error", err)
	}
}

// saveSubscriptions records added and removed subscriptions of a
// persistent session before its SUBACK/UNSUBACK.
func (h *Cluster) saveSubscriptions(ctx context.Context, s *clusterSession, added []packets.Subscription, since uint64, removed []string) {
	s.mu.Lock()
	for _, f := range added {
		old, existed := s.subs[f.Filter]
		sub := clusterSub{Subscription: storage.Subscription{
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
	h.flush(ctx, s, true)
}
