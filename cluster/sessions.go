package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrRevision is returned when a session record changed since the writer
// read it: another node owns the session now.
var ErrRevision = errors.New("cluster: session record changed (taken over)")

// SessionRecord is a session as the cluster keeps it. The broker fills
// State; the cluster reads only the fields it needs to replay.
type SessionRecord struct {
	ClientID   string `json:"id"`
	Owner      string `json:"owner"`      // node id holding the session
	Persistent bool   `json:"persistent"` // outlives its connection
	Connected  bool   `json:"connected"`
	// Floor: every KL_MSGS message at or below it that matched the session
	// was acknowledged by the client or dropped. Replay starts above it.
	Floor uint64 `json:"floor"`
	// Acked lists sequences above Floor the client has acknowledged, so a
	// replay does not send them again (bounded; losing some only costs duplicates).
	Acked          []uint64        `json:"acked,omitempty"`
	DisconnectedAt int64           `json:"disconnected_at,omitempty"` // unix seconds
	State          json.RawMessage `json:"state,omitempty"`
}

func sessionKey(clientID string) string { return "c." + hashToken(clientID) }

// LoadSession reads a client's record: nil and revision 0 when there is
// none. A read can be stale (any replica answers); writes decide.
func (n *Node) LoadSession(ctx context.Context, clientID string) (*SessionRecord, uint64, error) {
	e, err := n.kv.Get(ctx, sessionKey(clientID))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("cluster: load session: %w", err)
	}
	var rec SessionRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, e.Revision(), fmt.Errorf("cluster: session record of %q: %w", clientID, err)
	}
	if rec.ClientID != clientID {
		return nil, e.Revision(), fmt.Errorf("cluster: session key collision between %q and %q", clientID, rec.ClientID)
	}
	return &rec, e.Revision(), nil
}

// SaveSession writes rec if the record's revision is still rev (0: the
// record must not exist) and returns the new revision. ErrRevision means
// the session belongs to someone else now.
func (n *Node) SaveSession(ctx context.Context, rec *SessionRecord, rev uint64) (uint64, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("cluster: encode session: %w", err)
	}
	key := sessionKey(rec.ClientID)
	deadline := time.Now().Add(n.cfg.PublishTimeout)
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
		var nrev uint64
		if rev == 0 {
			nrev, err = n.kv.Create(actx, key, data)
		} else {
			nrev, err = n.kv.Update(actx, key, data, rev)
		}
		cancel()
		if err == nil {
			return nrev, nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, ErrRevision
		}
		if ctx.Err() != nil || time.Now().After(deadline) || n.stopped() {
			return 0, fmt.Errorf("cluster: save session: %w (%v)", ErrNotReady, err)
		}
		if !n.sleep(backoff(attempt)) {
			return 0, ErrNotReady
		}
	}
}

// DeleteSession deletes a client's record if it is still at revision rev.
func (n *Node) DeleteSession(ctx context.Context, clientID string, rev uint64) error {
	err := n.kv.Delete(ctx, sessionKey(clientID), jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return ErrRevision
	}
	if err != nil {
		return fmt.Errorf("cluster: delete session: %w", err)
	}
	return nil
}

// RequestRelease asks node owner to drop its copy of a client's session
// (closing the connection, writing its last state) if that copy is at
// record revision rev or older, and waits for it. A node that is gone has
// no responders: that is a success.
func (n *Node) RequestRelease(ctx context.Context, owner, clientID string, rev uint64) error {
	if owner == "" || owner == n.cfg.NodeID {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
	defer cancel()
	data, _ := json.Marshal(announcement{ClientID: clientID, Node: n.cfg.NodeID, Rev: rev})
	_, err := n.nc.RequestWithContext(ctx, subjRelease+NodeHash(owner), data)
	if err == nil || errors.Is(err, nats.ErrNoResponders) {
		return nil
	}
	return fmt.Errorf("cluster: ask node %s to release the session: %w", owner, err)
}

// announcement is a release request or an ownership announcement.
type announcement struct {
	ClientID string `json:"c"`
	Node     string `json:"n"`
	Rev      uint64 `json:"r"` // request: the revision read; announcement: the revision written
}

// Announce tells every node that this node holds the client since record
// revision rev; a node still holding an older copy (one that missed the
// release request) drops it. Announcements may arrive late: a copy at rev
// or newer is kept.
func (n *Node) Announce(clientID string, rev uint64) {
	data, _ := json.Marshal(announcement{ClientID: clientID, Node: n.cfg.NodeID, Rev: rev})
	if err := n.nc.Publish(subjAnnounce, data); err != nil {
		n.log.Warn("announce session owner", "error", err)
	}
	n.Stats.Takeovers.Add(1)
}

func (n *Node) onRelease(m *nats.Msg) {
	var a announcement
	if json.Unmarshal(m.Data, &a) != nil {
		return
	}
	if a.ClientID == "" { // a ping (Alive)
		_ = m.Respond([]byte("ok"))
		return
	}
	if n.h.Release != nil {
		n.h.Release(a.ClientID, a.Rev)
	}
	n.Stats.Released.Add(1)
	_ = m.Respond([]byte("ok"))
}

func (n *Node) onAnnounce(m *nats.Msg) {
	var a announcement
	if json.Unmarshal(m.Data, &a) != nil || a.Node == n.cfg.NodeID || a.Rev == 0 {
		return
	}
	if n.h.Release != nil {
		n.h.Release(a.ClientID, a.Rev-1)
	}
}

// Replay calls fn, in stream order, for every KL_MSGS message above
// sequence after whose subject one of the MQTT filters may match, up to the
// stream's last message when Replay starts. It returns that last sequence.
// fn sees candidates: it must match each message against the session's
// subscriptions itself.
func (n *Node) Replay(ctx context.Context, filters []string, after uint64, fn func(seq uint64, body []byte)) (uint64, error) {
	st, err := n.js.Stream(ctx, StreamMessages)
	if err != nil {
		return 0, fmt.Errorf("cluster: replay: %w", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("cluster: replay: %w", err)
	}
	last := info.State.LastSeq
	if last <= after || len(filters) == 0 {
		return last, nil
	}
	var subjects []string
	for _, f := range filters {
		s, err := FilterSubjects(KindQueued, f)
		if err != nil {
			continue
		}
		subjects = append(subjects, s...)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: consumerFilters(subjects), DeliverPolicy: jetstream.DeliverAllPolicy}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := n.js.OrderedConsumer(ctx, StreamMessages, cfg)
	if err != nil {
		return 0, fmt.Errorf("cluster: replay: %w", err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("cluster: replay: %w", err)
	}
	if ci.NumPending == 0 {
		return last, nil
	}
	it, err := cons.Messages(pullOpts(500)...)
	if err != nil {
		return 0, fmt.Errorf("cluster: replay: %w", err)
	}
	defer it.Stop()
	var seen uint64 // stream sequence of the last message delivered here
	for {
		m, err := it.Next(jetstream.NextMaxWait(n.cfg.RequestTimeout))
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			// Nothing within the wait. It is the end only if the consumer
			// has nothing left to send and nothing on its way: a lost pull
			// request stalls an ordered consumer until its heartbeat check
			// recreates it (pullHeartbeat), and a replay cut short there
			// would lose the session's messages.
			if ctx.Err() != nil {
				return 0, fmt.Errorf("cluster: replay: %w", ctx.Err())
			}
			if ci, ierr := cons.Info(ctx); ierr == nil && ci.NumPending == 0 && ci.Delivered.Stream <= max(seen, after) {
				return last, nil
			}
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("cluster: replay: %w", err)
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		seen = md.Sequence.Stream
		if md.Sequence.Stream > last {
			return last, nil
		}
		fn(md.Sequence.Stream, m.Data())
		if md.Sequence.Stream == last || md.NumPending == 0 {
			return last, nil
		}
	}
}

// LastSequence returns the sequence of the last message in KL_MSGS.
func (n *Node) LastSequence(ctx context.Context) (uint64, error) {
	st, err := n.js.Stream(ctx, StreamMessages)
	if err != nil {
		return 0, fmt.Errorf("cluster: %w", err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("cluster: %w", err)
	}
	return info.State.LastSeq, nil
}

// Sessions returns up to limit session records, sorted by client id: every
// client connected to any node and every persistent session, with its
// owner (without State and Acked).
func (n *Node) Sessions(ctx context.Context, limit int) ([]SessionRecord, error) {
	var out []SessionRecord
	err := n.ForEachSession(ctx, func(rec *SessionRecord, _ uint64) bool {
		rec.State, rec.Acked = nil, nil
		out = append(out, *rec)
		return len(out) < limit
	})
	slices.SortFunc(out, func(a, b SessionRecord) int { return strings.Compare(a.ClientID, b.ClientID) })
	return out, err
}

// ForEachSession calls fn with every session record and its revision until
// fn returns false.
func (n *Node) ForEachSession(ctx context.Context, fn func(rec *SessionRecord, rev uint64) bool) error {
	lister, err := n.kv.ListKeys(ctx)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil
		}
		return fmt.Errorf("cluster: list sessions: %w", err)
	}
	defer func() { _ = lister.Stop() }()
	for key := range lister.Keys() {
		e, err := n.kv.Get(ctx, key)
		if err != nil {
			continue // deleted meanwhile
		}
		var rec SessionRecord
		if json.Unmarshal(e.Value(), &rec) == nil && !fn(&rec, e.Revision()) {
			break
		}
	}
	return nil
}

// Alive reports whether node answers on its release subject (a node that
// is gone has no responders).
func (n *Node) Alive(ctx context.Context, node string) (bool, error) {
	if node == n.cfg.NodeID {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
	defer cancel()
	data, _ := json.Marshal(announcement{Node: n.cfg.NodeID}) // no client: a ping
	_, err := n.nc.RequestWithContext(ctx, subjRelease+NodeHash(node), data)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, nats.ErrNoResponders):
		return false, nil
	}
	return false, fmt.Errorf("cluster: is node %s alive: %w", node, err)
}
