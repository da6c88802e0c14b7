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

	"github.com/keyline-mq/keyline/internal/sessionrec"
	"github.com/keyline-mq/keyline/sessionstore"
)

// SessionStore returns the node's session records: the JetStream
// key-value bucket KL_SESSIONS, as a sessionstore.Store (the contract is
// written there; sessionstore/storetest checks it).
func (n *Node) SessionStore() sessionstore.Store { return kvSessions{n} }

// kvSessions is the session store over the node's bucket. A read can be
// stale (any replica answers); writes decide.
type kvSessions struct{ n *Node }

func sessionKey(clientID string) string { return "c." + hashToken(clientID) }

// encodeSession is a record as the bucket keeps it: sessionrec's form with
// the client id (the key is a hash of it) at revision 0 (the bucket's
// revision of the entry is the record's).
func encodeSession(rec *sessionstore.Record) []byte { return sessionrec.EncodeWithID(rec, 0) }

// decodeSession decodes a bucket value: sessionrec's form with the client
// id, or the JSON that keylines before it wrote (a value starting with
// '{'), so that a cluster upgraded node by node keeps its sessions. Its
// errors wrap sessionrec.ErrCorrupt.
func decodeSession(v []byte) (*sessionstore.Record, error) {
	if len(v) > 0 && v[0] == '{' {
		var rec sessionstore.Record
		if err := json.Unmarshal(v, &rec); err != nil {
			return nil, fmt.Errorf("%w: %w", sessionrec.ErrCorrupt, err)
		}
		return &rec, nil
	}
	rec, _, err := sessionrec.DecodeWithID(v)
	return rec, err
}

// Load reads a client's record: nil and revision 0 when there is none. A
// record that cannot be decoded is an error wrapping sessionrec.ErrCorrupt,
// with the entry's revision (what a Save that replaces it passes); one of
// another client id (a collision of the keys' hashes) is an error too.
func (s kvSessions) Load(ctx context.Context, clientID string) (*sessionstore.Record, uint64, error) {
	key := sessionKey(clientID)
	e, err := s.n.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("cluster: load session: %w", err)
	}
	rec, err := decodeSession(e.Value())
	if err != nil {
		return nil, e.Revision(), fmt.Errorf("cluster: session record of %q (key %s): %w", clientID, key, err)
	}
	if rec.ClientID != clientID {
		return nil, e.Revision(), fmt.Errorf("cluster: session key collision between %q and %q", clientID, rec.ClientID)
	}
	return rec, e.Revision(), nil
}

// Save writes rec if the record's revision is still rev (0: the record
// must not exist) and returns the new revision. sessionstore.ErrRevision
// means the session belongs to someone else now.
func (s kvSessions) Save(ctx context.Context, rec *sessionstore.Record, rev uint64) (uint64, error) {
	n := s.n
	data := encodeSession(rec)
	key := sessionKey(rec.ClientID)
	deadline := time.Now().Add(n.cfg.PublishTimeout)
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
		var nrev uint64
		var err error
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
			return 0, sessionstore.ErrRevision
		}
		if ctx.Err() != nil || time.Now().After(deadline) || n.stopped() {
			return 0, fmt.Errorf("cluster: save session: %w (%v)", ErrNotReady, err)
		}
		if !n.sleep(backoff(attempt)) {
			return 0, ErrNotReady
		}
	}
}

// Delete deletes a client's record if it is still at revision rev.
func (s kvSessions) Delete(ctx context.Context, clientID string, rev uint64) error {
	err := s.n.kv.Delete(ctx, sessionKey(clientID), jetstream.LastRevision(rev))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return sessionstore.ErrRevision
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
// fn sees candidates (the message at the stream's last sequence among them,
// whatever its subject): it must match each message against the session's
// subscriptions itself. It waits, within ctx, for a consumer on a stream
// replica that lags behind.
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
	// The consumer lives on any peer of the stream (nats-server places an
	// R1 consumer on a shuffled one), possibly a follower that has not
	// applied the newest messages yet: its pending count can be 0 while
	// messages up to last exist, and a replay that believed it lost them
	// (found by TestClusterNodes' replay failing once: "replay got []").
	// So the replay also takes the subject of the message at last and ends
	// when that message arrives: everything before it that the filters
	// take has come, in order. Without that subject (the message is gone)
	// it reads every subject.
	if subj, err := messageSubject(ctx, st, last); err == nil {
		subjects = append(subjects, subj)
	} else {
		subjects = []string{Prefix + "." + KindQueued + ".>"}
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: consumerFilters(subjects), DeliverPolicy: jetstream.DeliverAllPolicy}
	if after > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := n.orderedConsumer(ctx, StreamMessages, cfg)
	if err != nil {
		return 0, fmt.Errorf("cluster: replay: %w", err)
	}
	it, err := cons.Messages(pullOpts(500)...) // heartbeats: a lost pull request is noticed within pullHeartbeat
	if err != nil {
		return 0, fmt.Errorf("cluster: replay: %w", err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextMaxWait(n.cfg.RequestTimeout))
		if errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			if ctx.Err() != nil || n.stopped() {
				return 0, fmt.Errorf("cluster: replay: the stream's message %d never came: %w", last, ErrNotReady)
			}
			continue // the consumer's peer is catching up
		}
		if err != nil {
			return 0, fmt.Errorf("cluster: replay: %w", err)
		}
		md, err := m.Metadata()
		if err != nil {
			continue
		}
		if md.Sequence.Stream > last {
			return last, nil // last itself is gone: everything before it came
		}
		fn(md.Sequence.Stream, m.Data())
		if md.Sequence.Stream == last {
			return last, nil
		}
	}
}

// messageSubject returns the subject of the stream's message seq, asking
// again a few times: a direct get may be answered by a replica that does
// not have it yet.
func messageSubject(ctx context.Context, st jetstream.Stream, seq uint64) (string, error) {
	var err error
	for attempt := range 5 {
		var m *jetstream.RawStreamMsg
		if m, err = st.GetMsg(ctx, seq); err == nil {
			return m.Subject, nil
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) || ctx.Err() != nil {
			return "", err
		}
		select {
		case <-time.After(backoff(attempt)):
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	return "", err
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
func (n *Node) Sessions(ctx context.Context, limit int) ([]sessionstore.Record, error) {
	var out []sessionstore.Record
	err := n.SessionStore().ForEach(ctx, func(rec *sessionstore.Record, _ uint64) bool {
		rec.State, rec.Acked = nil, nil
		out = append(out, *rec)
		return len(out) < limit
	})
	slices.SortFunc(out, func(a, b sessionstore.Record) int { return strings.Compare(a.ClientID, b.ClientID) })
	return out, err
}

// ForEach calls fn with every session record and its revision until fn
// returns false. A record that cannot be decoded (or that is not under its
// client id's key) is skipped: fn has every other, and ForEach then returns
// an error that names the first one's key (wrapping sessionrec.ErrCorrupt).
func (s kvSessions) ForEach(ctx context.Context, fn func(rec *sessionstore.Record, rev uint64) bool) error {
	lister, err := s.n.kv.ListKeys(ctx)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil
		}
		return fmt.Errorf("cluster: list sessions: %w", err)
	}
	defer func() { _ = lister.Stop() }()
	var bad sessionrec.Unreadable
	for key := range lister.Keys() {
		e, err := s.n.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // deleted meanwhile
		}
		if err != nil {
			return fmt.Errorf("cluster: read session record %s: %w", key, err)
		}
		rec, err := decodeSession(e.Value())
		if err == nil && sessionKey(rec.ClientID) != key {
			err = fmt.Errorf("%w: it names client %q, whose key is %s", sessionrec.ErrCorrupt, rec.ClientID, sessionKey(rec.ClientID))
		}
		if err != nil {
			bad.Add(fmt.Errorf("cluster: session record %s: %w", key, err))
			continue
		}
		if !fn(rec, e.Revision()) {
			break
		}
	}
	return bad.Err()
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
