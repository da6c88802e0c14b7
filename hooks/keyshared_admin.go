package hooks

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
)

// The admin face of the Key-Shared hook: what the admin API, the metrics and
// the console see of groups, and the operations they may run on them.

// ErrGroupBusy is returned by DeleteGroup for a group that still has members.
var ErrGroupBusy = errors.New("keyshared hook: group has members")

// GroupStatus is a group's stored figures and live dispatch figures.
type GroupStatus struct {
	Info    keyshared.GroupInfo
	Stats   keyshared.Stats
	QoS0    keyshared.RouterStats
	Running bool
	// Holder is the node whose dispatcher serves the group (cluster mode).
	Holder string
}

// Groups returns every stored group's status, sorted by name; the
// broker's own (internal) groups are left out.
func (h *KeyShared) Groups() ([]GroupStatus, error) {
	infos, err := h.backend.Groups()
	if err != nil {
		return nil, err
	}
	out := make([]GroupStatus, 0, len(infos))
	for _, gi := range infos {
		if strings.HasPrefix(gi.Name, share.InternalPrefix) {
			continue
		}
		out = append(out, h.status(gi))
	}
	return out, nil
}

// Group returns one group's status. A group being deleted is reported
// once its dispatcher has stopped.
func (h *KeyShared) Group(name string) (GroupStatus, error) {
	h.reaping.RLock()
	defer h.reaping.RUnlock()
	gi, err := h.backend.Group(name)
	if err != nil {
		return GroupStatus{}, err
	}
	return h.status(gi), nil
}

func (h *KeyShared) status(gi keyshared.GroupInfo) GroupStatus {
	st := GroupStatus{Info: gi}
	g := h.groups.get(gi.Name)
	if g == nil {
		// A group another node made, not opened here yet (OpenGroup does
		// when its creation is heard): this node's side of it shows the
		// cluster-wide figures, and takes members that come here.
		if n, err := share.Parse(gi.Name); err == nil {
			g, _ = h.openGroup(n, false)
		}
	}
	if g != nil {
		st.Stats, st.QoS0 = g.d.Stats(), g.d.RouterStats()
		st.Holder, st.Running = g.d.Holder()
	}
	return st
}

// DeleteGroup stops a group and deletes its log, cursor and dead letters. A
// group with members is refused: they would recreate it at once.
func (h *KeyShared) DeleteGroup(ctx context.Context, name string) error {
	h.reaping.Lock()
	defer h.reaping.Unlock()
	if n := h.members.count(name); n > 0 {
		return fmt.Errorf("%w: group %s has %d members; they must unsubscribe first", ErrGroupBusy, name, n)
	}
	if g := h.groups.get(name); g != nil && g.ext.Load() != nil {
		return fmt.Errorf("%w: group %s is the queue of a configured bridge; remove the bridge first", ErrGroupBusy, name)
	}
	if g := h.groups.remove(name); g != nil {
		_ = g.d.Close(ctx)
	}
	return h.backend.DeleteGroup(name)
}

// SweepIdle deletes the groups that have had no members, no backlog and no
// dead letters for ttl, and returns their names. A group holding messages is
// never deleted this way.
func (h *KeyShared) SweepIdle(ctx context.Context, now time.Time, ttl time.Duration) ([]string, error) {
	h.reaping.Lock()
	defer h.reaping.Unlock()
	swept, err := h.backend.SweepIdle(now, ttl)
	for _, name := range swept {
		if g := h.groups.remove(name); g != nil {
			_ = g.d.Close(ctx)
		}
	}
	return swept, err
}

// SweepHolding deletes, with their backlog, the groups that have had no
// members for ttl and hold messages but no dead letters, and returns their
// names: what keeps a group alive is a member, not the messages it was sent
// (a client that joined a group and published to it left it holding them
// for ever, and groups are bounded). A group holding dead letters is kept.
func (h *KeyShared) SweepHolding(ctx context.Context, now time.Time, ttl time.Duration) ([]string, error) {
	infos, err := h.backend.Groups()
	if err != nil {
		return nil, err
	}
	var swept []string
	var errs []error
	for _, gi := range infos {
		if gi.Members > 0 || gi.DeadLetters > 0 || gi.Backlog == 0 || now.Sub(gi.LastSeen) < ttl {
			continue
		}
		if err := h.DeleteGroup(ctx, gi.Name); err != nil {
			if !errors.Is(err, ErrGroupBusy) && !errors.Is(err, keyshared.ErrGroupNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		swept = append(swept, gi.Name)
	}
	return swept, errors.Join(errs...)
}

// Members returns the ids of a group's members, sorted (in cluster mode,
// the members on every node).
func (h *KeyShared) Members(group string) []string {
	var out []string
	for _, m := range h.MemberInfos(group) {
		out = append(out, m.ID)
	}
	return out
}

// MemberInfo is what a group knows of one member.
type MemberInfo = keyshared.MemberInfo

// MemberInfos returns the members of a group with their subscriptions,
// sorted by id, as the group's registry has them (in cluster mode, the
// members on every node, with their node).
func (h *KeyShared) MemberInfos(group string) []MemberInfo {
	g := h.groups.get(group)
	if g == nil {
		return nil
	}
	return g.d.Members()
}

// DeadLetters returns up to limit dead letters of a group with ids after after.
func (h *KeyShared) DeadLetters(group string, after uint64, limit int) ([]keyshared.DeadLetterEntry, error) {
	return h.backend.DeadLetters(group, after, limit)
}

// DeadLetter returns one dead letter.
func (h *KeyShared) DeadLetter(group string, id uint64) (keyshared.DeadLetterEntry, error) {
	return h.backend.DeadLetter(group, id)
}

// ReplayDeadLetter puts a dead letter back at the tail of its group's log.
func (h *KeyShared) ReplayDeadLetter(group string, id uint64) (uint64, error) {
	return h.backend.ReplayDeadLetter(group, id)
}

// DeleteDeadLetter deletes one dead letter.
func (h *KeyShared) DeleteDeadLetter(group string, id uint64) error {
	return h.backend.DeleteDeadLetter(group, id)
}

// PurgeDeadLetters deletes all of a group's dead letters and returns how many.
func (h *KeyShared) PurgeDeadLetters(group string) (int, error) {
	return h.backend.PurgeDeadLetters(group)
}

// PendingMessage is a message of a group's log past its cursor and where it stands.
type PendingMessage struct {
	keyshared.Message
	// Status is the dispatcher's answer; when the group is not running (no
	// member has subscribed since the broker started) nothing has been read
	// and every message is StateUnread.
	Status keyshared.MessageStatus
}

// Pending returns the group's status and up to limit messages of its log
// after the cursor, with the dispatcher's state of each; more reports
// whether the log holds more.
func (h *KeyShared) Pending(ctx context.Context, group string, limit int) (st GroupStatus, msgs []PendingMessage, more bool, err error) {
	st, err = h.Group(group)
	if err != nil {
		return st, nil, false, err
	}
	cursor := st.Info.Cursor
	if st.Running {
		cursor = max(cursor, st.Stats.Cursor)
	}
	read, err := h.backend.Pending(group, cursor+1, limit+1)
	if err != nil {
		return st, nil, false, err
	}
	if len(read) > limit {
		read, more = read[:limit], true
	}
	statuses := make([]keyshared.MessageStatus, len(read))
	if g := h.groups.get(group); g != nil {
		offs := make([]uint64, len(read))
		for i, m := range read {
			offs[i] = m.Offset
		}
		if statuses, err = g.d.States(ctx, offs); err != nil {
			return st, nil, false, err
		}
	} else {
		for i, m := range read {
			statuses[i] = keyshared.MessageStatus{Offset: m.Offset, State: keyshared.StateUnread}
		}
	}
	msgs = make([]PendingMessage, len(read))
	for i, m := range read {
		msgs[i] = PendingMessage{Message: m, Status: statuses[i]}
	}
	return st, msgs, more, nil
}
