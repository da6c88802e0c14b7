package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/keyshared"
)

// The Key-Shared admin API: groups and their dead letters under /api/v1.
// Groups are named by the query parameter group=<share>/<filter> (URL-encoded:
// '#' as %23, '+' as %2B) because names contain '/', '#' and '+'.

// groupAdmin serves the group and dead-letter routes and feeds the group
// metrics; both share its rate samples.
type groupAdmin struct {
	s      *Service // its config and logger
	groups Groups
	rates  rateTracker
}

// register adds the group and dead-letter routes to mux, and a JSON 404/405
// for any other /api/v1 path.
func (a *groupAdmin) register(mux *http.ServeMux) {
	mux.HandleFunc("GET "+adminapi.PathGroups, a.handleGroups)
	mux.HandleFunc("GET "+adminapi.PathGroupDetail, a.handleGroupDetail)
	mux.HandleFunc("DELETE "+adminapi.PathGroups, a.handleDeleteGroup)
	mux.HandleFunc("GET "+adminapi.PathDLQ, a.handleDeadLetters)
	mux.HandleFunc("GET "+adminapi.PathDLQLetter, a.handleDeadLetter)
	mux.HandleFunc("POST "+adminapi.PathDLQReplay, a.handleReplay)
	mux.HandleFunc("POST "+adminapi.PathDLQPurge, a.handlePurge)
	const catchAll = "/api/v1/"
	mux.HandleFunc(catchAll, func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, p := mux.Handler(probe); p != catchAll && p != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeJSON(w, http.StatusMethodNotAllowed, adminapi.Error{Error: fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", "))})
			return
		}
		writeJSON(w, http.StatusNotFound, adminapi.Error{Error: "no API endpoint " + r.URL.Path})
	})
}

// --- handlers ---

func (a *groupAdmin) handleGroups(w http.ResponseWriter, r *http.Request) {
	if _, err := queryParams(r); err != nil {
		badRequest(w, err)
		return
	}
	views, err := a.groupViews()
	if err != nil {
		a.storeError(w, err, "", 0)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"groups": views})
}

func (a *groupAdmin) handleGroupDetail(w http.ResponseWriter, r *http.Request) {
	name, err := groupTarget(r)
	if err != nil {
		badRequest(w, err)
		return
	}
	v, err := a.groupDetail(name)
	if err != nil {
		a.storeError(w, err, name, 0)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (a *groupAdmin) handleDeleteGroup(w http.ResponseWriter, r *http.Request) {
	name, err := groupTarget(r)
	if err != nil {
		badRequest(w, err)
		return
	}
	res, err := a.deleteGroup(r.Context(), name, r.RemoteAddr)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// deleteGroup deletes a group without members; remote names who asked, for the log.
func (a *groupAdmin) deleteGroup(ctx context.Context, name, remote string) (adminapi.DeleteGroupResult, error) {
	st, err := a.groups.Group(name)
	if err != nil {
		return adminapi.DeleteGroupResult{}, a.statusError(err, name, 0)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := a.groups.DeleteGroup(ctx, name); err != nil {
		return adminapi.DeleteGroupResult{}, a.statusError(err, name, 0)
	}
	a.s.log.Info("deleted group through the admin API", "group", name, "backlog", st.Info.Backlog, "dead_letters", st.Info.DeadLetters, "remote", remote)
	return adminapi.DeleteGroupResult{Deleted: name, Backlog: st.Info.Backlog, DeadLetters: st.Info.DeadLetters}, nil
}

func (a *groupAdmin) handleDeadLetters(w http.ResponseWriter, r *http.Request) {
	q, err := queryParams(r, "group", "after", "limit")
	if err != nil {
		badRequest(w, err)
		return
	}
	name, err := groupParam(q)
	if err != nil {
		badRequest(w, err)
		return
	}
	after, _, err := uintParam(q, "after")
	if err != nil {
		badRequest(w, err)
		return
	}
	limit, err := limitParam(q, adminapi.DefaultDLQLimit, adminapi.MaxDLQLimit)
	if err != nil {
		badRequest(w, err)
		return
	}
	st, err := a.groups.Group(name)
	if err != nil {
		writeError(w, a.statusError(err, name, 0))
		return
	}
	// The page is written as it is read, a few letters at a time: what it
	// holds in memory is one batch, not the page.
	head, _ := json.Marshal(struct {
		Group string `json:"group"`
		Total uint64 `json:"total"`
	}{name, st.Info.DeadLetters})
	w.Header().Set("Content-Type", "application/json")
	started := false
	n, err := a.eachPreview(name, after, limit, dlqPageBytes-len(head)-64, func(v *adminapi.DeadLetterView, b []byte) error {
		if !started {
			started = true
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(head[:len(head)-1])
			_, _ = io.WriteString(w, `,"dead_letters":[`)
		} else {
			_, _ = io.WriteString(w, ",")
		}
		_, err := w.Write(b)
		return err
	})
	if err != nil && !started {
		writeError(w, a.statusError(err, name, 0))
		return
	}
	if !started {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(head[:len(head)-1])
		_, _ = io.WriteString(w, `,"dead_letters":[`)
	}
	if err != nil {
		a.s.log.Warn("admin API: a dead-letter page ended early", "group", name, "error", err)
		return // the answer has begun: the client sees it cut short
	}
	tail := `],"more":false}` + "\n"
	if n.more {
		tail = fmt.Sprintf(`],"more":true,"next_after":%d}`+"\n", n.last)
	}
	_, _ = io.WriteString(w, tail)
}

// dlqBatch is how many dead letters a page (or a replay of all) reads from
// the store at once; maxListedBytes bounds the keys and topics a
// ReplayResult lists.
const (
	dlqBatch       = 8
	maxListedBytes = 1 << 20
)

// dlqPageBytes is adminapi.MaxDLQPageBytes (a variable for the tests).
var dlqPageBytes = adminapi.MaxDLQPageBytes

// previews is what eachPreview did: the last id it gave, and whether
// more letters follow (after last).
type previews struct {
	last uint64
	more bool
	n    int
}

// eachPreview calls fn with the previews (and their JSON) of up to limit
// dead letters of group name after id after, in id order, until their JSON
// would pass maxBytes (the first one always goes).
func (a *groupAdmin) eachPreview(name string, after uint64, limit, maxBytes int, fn func(*adminapi.DeadLetterView, []byte) error) (previews, error) {
	var p previews
	size := 0
	for {
		want := min(dlqBatch, limit-p.n)
		entries, err := a.groups.DeadLetters(name, after, want+1) // one more: whether more follow
		if err != nil {
			return p, err
		}
		for _, e := range entries[:min(want, len(entries))] {
			v := deadLetterPreview(e)
			b, err := json.Marshal(&v)
			if err != nil {
				return p, err
			}
			if p.n > 0 && size+len(b)+1 > maxBytes {
				p.more = true
				return p, nil
			}
			if err := fn(&v, b); err != nil {
				return p, err
			}
			size += len(b) + 1
			p.n++
			p.last, after = e.ID, e.ID
		}
		switch {
		case len(entries) <= want:
			return p, nil // the store has no more
		case p.n == limit:
			p.more = true
			return p, nil
		}
	}
}

// deadLetterPage returns up to limit dead letters of group name with ids
// after after, as previews, within adminapi.MaxDLQPageBytes.
func (a *groupAdmin) deadLetterPage(name string, after uint64, limit int) (adminapi.DeadLetterPage, error) {
	st, err := a.groups.Group(name)
	if err != nil {
		return adminapi.DeadLetterPage{}, a.statusError(err, name, 0)
	}
	page := adminapi.DeadLetterPage{Group: name, Total: st.Info.DeadLetters, DeadLetters: []adminapi.DeadLetterView{}}
	p, err := a.eachPreview(name, after, limit, dlqPageBytes, func(v *adminapi.DeadLetterView, _ []byte) error {
		page.DeadLetters = append(page.DeadLetters, *v)
		return nil
	})
	if err != nil {
		return adminapi.DeadLetterPage{}, a.statusError(err, name, 0)
	}
	if p.more {
		page.More, page.NextAfter = true, p.last
	}
	return page, nil
}

// handleDeadLetter answers GET /api/v1/dlq/letter?group=&id=: one dead
// letter in full.
func (a *groupAdmin) handleDeadLetter(w http.ResponseWriter, r *http.Request) {
	name, id, one, err := dlqTarget(r)
	switch {
	case err != nil:
		badRequest(w, err)
		return
	case !one:
		badRequest(w, errors.New(`missing query parameter "id" (the dead letter's id)`))
		return
	}
	v, err := a.deadLetter(name, id)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// deadLetter returns dead letter id of group name in full.
func (a *groupAdmin) deadLetter(name string, id uint64) (adminapi.DeadLetterView, error) {
	e, err := a.groups.DeadLetter(name, id)
	if err != nil {
		return adminapi.DeadLetterView{}, a.statusError(err, name, id)
	}
	return deadLetterView(e), nil
}

// groupTarget reads the group= parameter of a request that takes nothing else.
func groupTarget(r *http.Request) (string, error) {
	q, err := queryParams(r, "group")
	if err != nil {
		return "", err
	}
	return groupParam(q)
}

// dlqTarget reads the group= and optional id= parameters of a dead-letter action.
func dlqTarget(r *http.Request) (name string, id uint64, one bool, err error) {
	q, err := queryParams(r, "group", "id")
	if err != nil {
		return "", 0, false, err
	}
	if name, err = groupParam(q); err != nil {
		return "", 0, false, err
	}
	id, one, err = uintParam(q, "id")
	return name, id, one, err
}

func (a *groupAdmin) handleReplay(w http.ResponseWriter, r *http.Request) {
	name, id, one, err := dlqTarget(r)
	if err != nil {
		badRequest(w, err)
		return
	}
	res, err := a.replay(r.Context(), name, id, one, r.RemoteAddr)
	var se *adminapi.StatusError
	switch {
	case errors.As(err, &se) && res.Group != "":
		writeJSON(w, se.Status, res) // failed part way: what was replayed, and why it stopped
	case err != nil:
		writeError(w, err)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

// replay puts dead letter id (every one unless one) of group name back on
// its log. When it fails part way the result lists what was replayed, its
// Error says why, and the error is a *adminapi.StatusError.
func (a *groupAdmin) replay(ctx context.Context, name string, id uint64, one bool, remote string) (adminapi.ReplayResult, error) {
	var todo []adminapi.ReplayedLetter // offsets filled in as they are replayed
	if one {
		e, err := a.groups.DeadLetter(name, id)
		if err != nil {
			return adminapi.ReplayResult{}, a.statusError(err, name, id)
		}
		todo = append(todo, adminapi.ReplayedLetter{ID: e.ID, Key: e.Message.Key, Topic: e.Message.Topic})
	} else {
		// Replay what is there now: a letter that dies again meanwhile gets a
		// new id and waits. The letters are read a few at a time (they carry
		// their payloads), and only the first ones' key and topic are kept,
		// for the listing.
		listed := 0
		for after := uint64(0); ; {
			page, err := a.groups.DeadLetters(name, after, dlqBatch)
			if err != nil {
				return adminapi.ReplayResult{}, a.statusError(err, name, 0)
			}
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				rl := adminapi.ReplayedLetter{ID: e.ID}
				if n := len(e.Message.Key) + len(e.Message.Topic); len(todo) < adminapi.MaxListedReplays && listed+n <= maxListedBytes {
					rl.Key, rl.Topic, listed = e.Message.Key, e.Message.Topic, listed+n
				}
				todo = append(todo, rl)
			}
			after = page[len(page)-1].ID
		}
	}
	res := adminapi.ReplayResult{Group: name, Replayed: []adminapi.ReplayedLetter{}}
	defer func() {
		if res.Count > 0 {
			a.s.log.Info("replayed dead letters through the admin API", "group", name, "count", res.Count, "remote", remote)
		}
	}()
	for _, rl := range todo {
		if ctx.Err() != nil {
			break // the client went away: stop between replays, each is atomic
		}
		off, err := a.groups.ReplayDeadLetter(name, rl.ID)
		if errors.Is(err, keyshared.ErrDeadLetterNotFound) && !one {
			continue // replayed or purged meanwhile
		}
		if err != nil {
			se := a.statusError(err, name, rl.ID)
			if res.Count > 0 {
				se.Message = fmt.Sprintf("%s (after replaying %d)", se.Message, res.Count)
			}
			res.Error = se.Message
			return res, se
		}
		res.Count++
		if len(res.Replayed) < adminapi.MaxListedReplays && (rl.Topic != "" || one) {
			rl.Offset = off
			res.Replayed = append(res.Replayed, rl)
		} else {
			res.Truncated = true
		}
	}
	return res, nil
}

func (a *groupAdmin) handlePurge(w http.ResponseWriter, r *http.Request) {
	name, id, one, err := dlqTarget(r)
	if err != nil {
		badRequest(w, err)
		return
	}
	res, err := a.purge(name, id, one, r.RemoteAddr)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// purge deletes dead letter id (every one unless one) of group name.
func (a *groupAdmin) purge(name string, id uint64, one bool, remote string) (adminapi.PurgeResult, error) {
	res := adminapi.PurgeResult{Group: name}
	var err error
	if one {
		err = a.groups.DeleteDeadLetter(name, id)
		res.Purged = 1
	} else {
		res.Purged, err = a.groups.PurgeDeadLetters(name)
	}
	if err != nil {
		return adminapi.PurgeResult{}, a.statusError(err, name, id)
	}
	a.s.log.Info("purged dead letters through the admin API", "group", name, "count", res.Purged, "remote", remote)
	return res, nil
}
