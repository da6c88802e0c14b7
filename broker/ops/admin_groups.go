package ops

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/persistence"
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
	page, err := a.deadLetterPage(name, after, limit)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

// deadLetterPage returns up to limit dead letters of group name with ids after after.
func (a *groupAdmin) deadLetterPage(name string, after uint64, limit int) (adminapi.DeadLetterPage, error) {
	st, err := a.groups.Group(name)
	if err != nil {
		return adminapi.DeadLetterPage{}, a.statusError(err, name, 0)
	}
	info := st.Info
	entries, err := a.groups.DeadLetters(name, after, limit+1)
	if err != nil {
		return adminapi.DeadLetterPage{}, a.statusError(err, name, 0)
	}
	page := adminapi.DeadLetterPage{Group: name, Total: info.DeadLetters, DeadLetters: []adminapi.DeadLetterView{}}
	if len(entries) > limit {
		entries = entries[:limit]
		page.More, page.NextAfter = true, entries[len(entries)-1].ID
	}
	for _, e := range entries {
		page.DeadLetters = append(page.DeadLetters, deadLetterView(e))
	}
	return page, nil
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
		// Replay what is there now: a letter that dies again meanwhile gets a new id and waits.
		for after := uint64(0); ; {
			page, err := a.groups.DeadLetters(name, after, 512)
			if err != nil {
				return adminapi.ReplayResult{}, a.statusError(err, name, 0)
			}
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				todo = append(todo, adminapi.ReplayedLetter{ID: e.ID, Key: e.Message.Key, Topic: e.Message.Topic})
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
		if errors.Is(err, persistence.ErrDeadLetterNotFound) && !one {
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
		if len(res.Replayed) < adminapi.MaxListedReplays {
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
