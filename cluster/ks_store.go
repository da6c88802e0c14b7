package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
)

var _ keyshared.Backend = (*Groups)(nil)

// known returns the hash of a group that exists.
func (g *Groups) config(gh string) keyshared.GroupConfig {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.metas[gh].Config
}

func (g *Groups) known(name string) (string, error) {
	if _, err := share.Parse(name); err != nil {
		return "", fmt.Errorf("%w: %w", keyshared.ErrBadGroupName, err)
	}
	gh := groupHash(name)
	g.mu.Lock()
	_, ok := g.mu.metas[gh]
	g.mu.Unlock()
	if !ok {
		return "", fmt.Errorf("%w: %q", keyshared.ErrGroupNotFound, name)
	}
	return gh, nil
}

// streamConfig is the stream of a group's log. The backlog rule
// (GroupConfig.Limits, package internal/backlog) becomes its limits, which
// JetStream enforces on what the stream holds: the holder purges what is
// resolved below the cursor, so what it holds is the unresolved backlog
// (plus resolved messages above the cursor until the cursor passes them).
// reject is DiscardNew, drop-oldest DiscardOld; a message larger than
// MaxBytes is refused before it is sent (Groups.AppendMultiAsync).
func streamConfig(gh string, cfg keyshared.GroupConfig, replicas int) jetstream.StreamConfig {
	lim := cfg.Limits()
	sc := jetstream.StreamConfig{
		Name: groupStream(gh), Description: "Keyline Key-Shared group log", Subjects: []string{groupSubject(gh)},
		Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage, Replicas: replicas,
		Duplicates: 2 * time.Minute, AllowDirect: true, MaxMsgs: -1, MaxBytes: -1, Discard: jetstream.DiscardNew,
		// Appends go in atomic batches (ks_append.go). Not compared by
		// streamDiff: a stream made without it is switched on its first
		// refused batch, and a server too old for it ignores the field.
		AllowAtomicPublish: true,
	}
	if lim.MaxMessages > 0 {
		sc.MaxMsgs = int64(min(lim.MaxMessages, 1<<62))
	}
	if lim.MaxBytes > 0 {
		sc.MaxBytes = int64(min(lim.MaxBytes, 1<<62))
	}
	if lim.DropOldest {
		sc.Discard = jetstream.DiscardOld
	}
	return sc
}

// EnsureGroup implements keyshared.Backend: the group's meta in
// KL_GROUPS and its log stream, with the backlog limits as stream limits
// (reject: DiscardNew; drop-oldest: DiscardOld).
func (g *Groups) EnsureGroup(name string, cfg keyshared.GroupConfig) (bool, error) {
	if _, err := share.Parse(name); err != nil {
		return false, fmt.Errorf("%w: %w", keyshared.ErrBadGroupName, err)
	}
	if err := cfg.Validate(); err != nil {
		return false, err
	}
	gh := groupHash(name)
	g.mu.Lock()
	known, ok := g.mu.metas[gh]
	g.mu.Unlock()
	if ok && known.Name == name && known.Config == cfg {
		return false, nil // as the watch of KL_GROUPS shows it: nothing to change
	}
	ctx, cancel := g.ctx()
	defer cancel()
	// The stream first: a node that sees the meta may start the holder.
	if err := g.node.ensureStream(ctx, newStartWait(g.log), streamConfig(gh, cfg, g.node.replicas)); err != nil {
		return false, fmt.Errorf("cluster: group %s: log stream: %w", name, err)
	}
	meta := groupMeta{Name: name, Config: cfg, Created: time.Now().UTC()}
	data, _ := json.Marshal(meta)
	created := false
	for attempt := 0; ; attempt++ {
		_, err := g.kv.Create(ctx, "m."+gh, data)
		if err == nil {
			created = true
			break
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return false, fmt.Errorf("cluster: group %s: %w", name, err)
		}
		e, err := g.kv.Get(ctx, "m."+gh)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			// Another node created it (or deleted it) a moment ago, and the
			// read went to a replica that has not applied that yet (KV reads
			// are direct gets, served by any replica): members of a group
			// subscribing on several nodes at once were refused with 0x80
			// for it. Create again, or read again once the replica has it.
			if !sleepOr(ctx.Done(), backoff(attempt)) {
				return false, fmt.Errorf("cluster: group %s: %w", name, ctx.Err())
			}
			continue
		}
		if err != nil {
			return false, fmt.Errorf("cluster: group %s: %w", name, err)
		}
		var old groupMeta
		if json.Unmarshal(e.Value(), &old) == nil {
			if old.Name != name {
				return false, fmt.Errorf("cluster: group %q collides with %q", name, old.Name)
			}
			meta.Created = old.Created
			if old.Config != cfg {
				data, _ = json.Marshal(meta)
				if _, err := g.kv.Update(ctx, "m."+gh, data, e.Revision()); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
					return false, fmt.Errorf("cluster: group %s: %w", name, err)
				}
			}
		}
		break
	}
	g.mu.Lock()
	g.mu.metas[gh] = meta
	g.mu.Unlock()
	g.kickPlacement()
	return created, nil
}

// DeleteGroup implements keyshared.Backend: its log, state, lease,
// meta and dead letters go; its holder stops when it sees the meta go.
func (g *Groups) DeleteGroup(name string) error {
	gh, err := g.known(name)
	if err != nil {
		return err
	}
	ctx, cancel := g.ctx()
	defer cancel()
	if err := g.kv.Purge(ctx, "m."+gh); err != nil {
		return fmt.Errorf("cluster: delete group %s: %w", name, err)
	}
	g.mu.Lock()
	delete(g.mu.metas, gh)
	h := g.mu.holders[gh]
	g.mu.Unlock()
	if h != nil {
		h.stopHolding(false)
	}
	var errs []error
	if err := g.node.js.DeleteStream(ctx, groupStream(gh)); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		errs = append(errs, err)
	}
	for _, k := range []string{g.stateKey(gh), g.leaseKey(gh)} {
		if err := g.kv.Purge(ctx, k); err != nil {
			errs = append(errs, err)
		}
	}
	if s, err := g.node.js.Stream(ctx, StreamDLQ); err == nil {
		errs = append(errs, s.Purge(ctx, jetstream.WithPurgeSubject(dlqSubject(gh))))
	}
	return errors.Join(errs...)
}

// Group implements keyshared.Backend.
func (g *Groups) Group(name string) (keyshared.GroupInfo, error) {
	gh, err := g.known(name)
	if err != nil {
		return keyshared.GroupInfo{}, err
	}
	return g.info(gh)
}

// Groups implements keyshared.Backend.
func (g *Groups) Groups() ([]keyshared.GroupInfo, error) {
	g.mu.Lock()
	ghs := make([]string, 0, len(g.mu.metas))
	for gh := range g.mu.metas {
		ghs = append(ghs, gh)
	}
	g.mu.Unlock()
	out := make([]keyshared.GroupInfo, len(ghs))
	errs := make([]error, len(ghs))
	var wg sync.WaitGroup
	for i, gh := range ghs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = g.info(gh)
		}()
	}
	wg.Wait()
	kept := out[:0]
	for i, gi := range out {
		if errs[i] == nil {
			kept = append(kept, gi)
		} else if !errors.Is(errs[i], keyshared.ErrGroupNotFound) {
			return nil, errs[i]
		}
	}
	slices.SortFunc(kept, func(a, b keyshared.GroupInfo) int { return strings.Compare(a.Name, b.Name) })
	return kept, nil
}

// info reads a group's figures: its meta, log stream, replicated state and
// dead-letter count.
func (g *Groups) info(gh string) (keyshared.GroupInfo, error) {
	g.mu.Lock()
	meta, ok := g.mu.metas[gh]
	g.mu.Unlock()
	if !ok {
		return keyshared.GroupInfo{}, keyshared.ErrGroupNotFound
	}
	n, _ := share.Parse(meta.Name)
	gi := keyshared.GroupInfo{Name: meta.Name, Share: n.Share, Filter: n.Filter, Created: meta.Created, Config: meta.Config}
	ctx, cancel := g.ctx()
	defer cancel()
	s, err := g.node.js.Stream(ctx, groupStream(gh))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return gi, fmt.Errorf("%w: %q", keyshared.ErrGroupNotFound, meta.Name)
	}
	if err != nil {
		return gi, fmt.Errorf("cluster: group %s: %w", meta.Name, err)
	}
	si, err := s.Info(ctx)
	if err != nil {
		return gi, fmt.Errorf("cluster: group %s: %w", meta.Name, err)
	}
	gi.Head, gi.StoredMessages, gi.StoredBytes = si.State.LastSeq, si.State.Msgs, si.State.Bytes
	st, err := g.loadStateOnly(ctx, gh)
	if err != nil {
		return gi, err
	}
	gi.Cursor = max(st.cursor, si.State.FirstSeq-min(si.State.FirstSeq, 1))
	if gi.Head > gi.Cursor {
		gi.Backlog = gi.Head - gi.Cursor - st.resolved.count()
	}
	gi.Dropped, gi.Members, gi.LastSeen = st.dropped, st.members, st.lastSeen
	if gi.LastSeen.IsZero() {
		gi.LastSeen = meta.Created
	}
	gi.DeadLetters, err = g.deadLetterCount(ctx, gh)
	return gi, err
}

func (g *Groups) loadStateOnly(ctx context.Context, gh string) (groupState, error) {
	e, err := g.kv.Get(ctx, g.stateKey(gh))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return groupState{}, nil
	}
	if err != nil {
		return groupState{}, fmt.Errorf("cluster: group state: %w", err)
	}
	return decodeGroupState(e.Value())
}

// Pending implements keyshared.Backend: a read of the group's stream from
// any node, skipping what the replicated state says is resolved.
func (g *Groups) Pending(name string, from uint64, limit int) ([]keyshared.Message, error) {
	gh, err := g.known(name)
	if err != nil {
		return nil, err
	}
	return (&viewLog{g: g, gh: gh}).ReadFrom(from, limit, nil)
}

// AppendMultiAsync implements keyshared.Backend: the message goes to each
// group's log; done runs once all answered, on a goroutine of the appender
// (callbacks of different publishes may run concurrently; per group and
// routing key one batch of appends is in flight, so those of a key
// complete in order). The
// backlog rule's size check comes first; its counts are the stream's
// limits (streamConfig).
func (g *Groups) AppendMultiAsync(groups []string, m keyshared.Message, done func([]keyshared.AppendResult)) {
	data := keyshared.EncodeMessage(&m)
	rs := make([]keyshared.AppendResult, len(groups))
	var mu sync.Mutex
	left := len(groups)
	for i, name := range groups {
		rs[i].Group = name
		gh, err := g.known(name)
		if err == nil {
			if lim := g.config(gh).Limits(); lim.TooLarge(uint64(len(data))) {
				err = fmt.Errorf("%w: group %q: message of %d bytes exceeds the limit of %d bytes", keyshared.ErrBacklogFull, name, len(data), lim.MaxBytes)
			}
		}
		if err != nil {
			rs[i].Err = err
			mu.Lock()
			left--
			last := left == 0
			mu.Unlock()
			if last {
				done(rs)
			}
			continue
		}
		g.appends.append(gh, m.Key, "", data, func(off uint64, err error) {
			mu.Lock()
			rs[i].Offset, rs[i].Err = off, err
			left--
			last := left == 0
			mu.Unlock()
			if last {
				done(rs)
			}
		})
	}
}

// SweepIdle implements keyshared.Backend for the groups this node
// holds: without members for ttl, with nothing unresolved and no dead
// letter, they are deleted.
func (g *Groups) SweepIdle(now time.Time, ttl time.Duration) ([]string, error) {
	g.mu.Lock()
	var held []*holder
	for _, h := range g.mu.holders {
		held = append(held, h)
	}
	g.mu.Unlock()
	var swept []string
	var errs []error
	for _, h := range held {
		h.mu.Lock()
		idle := len(h.mu.members) == 0 && now.Sub(h.mu.lastSeen) >= ttl && !strings.HasPrefix(h.name, share.InternalPrefix)
		h.mu.Unlock()
		if !idle {
			continue
		}
		gi, err := g.info(h.gh)
		if err != nil || gi.Backlog > 0 || gi.DeadLetters > 0 {
			continue
		}
		if err := g.DeleteGroup(h.name); err != nil {
			errs = append(errs, err)
			continue
		}
		swept = append(swept, h.name)
	}
	return swept, errors.Join(errs...)
}

// OnCommitted implements keyshared.Backend: a no-op reporting false, as
// JetStream acknowledges each append on its own (no commit of several to
// tell the end of).
func (g *Groups) OnCommitted(func()) bool { return false }

// Flush implements keyshared.Backend: it waits for the appends made so far.
func (g *Groups) Flush() error {
	g.appends.flush()
	return nil
}

// viewLog reads a group's log from any node (admin views); it resolves nothing.
type viewLog struct {
	g  *Groups
	gh string
}

func (l *viewLog) ReadFrom(from uint64, limit int, buf []keyshared.Message) ([]keyshared.Message, error) {
	ctx, cancel := l.g.ctx()
	defer cancel()
	s, err := l.g.node.js.Stream(ctx, groupStream(l.gh))
	if err != nil {
		return buf, err
	}
	st, err := l.g.loadStateOnly(ctx, l.gh)
	if err != nil {
		return buf, err
	}
	for seq := max(from, 1); limit > 0; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(groupSubject(l.gh)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		seq = m.Sequence + 1
		if m.Sequence <= st.cursor || st.resolved.contains(m.Sequence) {
			continue
		}
		msg, err := keyshared.DecodeMessage(m.Data, true)
		if err != nil {
			continue
		}
		msg.Offset = m.Sequence
		buf = append(buf, msg)
		limit--
	}
	return buf, nil
}

func (l *viewLog) Head() uint64 {
	gi, err := l.g.info(l.gh)
	if err != nil {
		return 0
	}
	return gi.Head
}

func (l *viewLog) LoadCursor() (uint64, error) {
	ctx, cancel := l.g.ctx()
	defer cancel()
	st, err := l.g.loadStateOnly(ctx, l.gh)
	return st.cursor, err
}

func (l *viewLog) Resolve([]uint64) {}

func (l *viewLog) DeadLetter(keyshared.DeadLetter) error {
	return errors.New("cluster: a read-only view of a group log takes no dead letter")
}
