package ops

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/keyline-mq/keyline/broker/console"
	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// WriteJSON answers with v as indented JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (b *Service) handleClients(w http.ResponseWriter, _ *http.Request) {
	views := b.b.Clients()
	if views == nil {
		views = []adminapi.ClientView{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"clients": views})
}

func (b *Service) handleClient(w http.ResponseWriter, r *http.Request) {
	v, err := b.b.Client(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// openPaths are served without the admin token.
var openPaths = map[string]bool{"/metrics": true, "/healthz": true, "/readyz": true}

// adminHandler guards next: every path but /metrics, /healthz, /readyz and
// the console's login page and assets needs the bearer token when one is
// configured (or the cookie of a console session), and state-changing
// cross-origin browser requests are refused (CSRF). Every bearer token is
// checked through the guess gate (console.Auth.Check).
func (b *Service) adminHandler(next http.Handler, auth *console.Auth) http.Handler {
	csrf := http.NewCrossOriginProtection()
	csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusForbidden, adminapi.Error{Error: "cross-origin request refused"})
	}))
	next = csrf.Handler(next)
	if auth.Open() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPaths[r.URL.Path] || console.Public(r.URL.Path) || auth.Session(r) {
			next.ServeHTTP(w, r)
			return
		}
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		switch {
		case (!ok || !strings.EqualFold(scheme, "Bearer")) && wantsLogin(r):
			redirectToLogin(w, r) // a browser opening a console page
		case !ok || !strings.EqualFold(scheme, "Bearer"):
			w.Header().Set("WWW-Authenticate", `Bearer realm="keyline"`)
			writeJSON(w, http.StatusUnauthorized, adminapi.Error{Error: "missing bearer token: send Authorization: Bearer <http-token>"})
		default:
			good, err := auth.Check(r, strings.TrimSpace(got))
			switch {
			case err != nil: // the client went away while it waited for its turn
			case !good:
				b.log.Warn("admin API request refused: wrong bearer token", "remote", r.RemoteAddr, "path", r.URL.Path)
				w.Header().Set("WWW-Authenticate", `Bearer realm="keyline", error="invalid_token"`)
				writeJSON(w, http.StatusUnauthorized, adminapi.Error{Error: "wrong bearer token"})
			default:
				next.ServeHTTP(w, r)
			}
		}
	})
}

// queryParams parses the query string, refusing malformed ones, parameters
// other than allowed and repeated parameters.
func queryParams(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("malformed query string: %v", err)
	}
	for k, vs := range q {
		known := false
		for _, a := range allowed {
			known = known || k == a
		}
		switch {
		case !known && len(allowed) == 0:
			return nil, fmt.Errorf("unknown query parameter %q (this endpoint takes none)", k)
		case !known:
			return nil, fmt.Errorf("unknown query parameter %q (want %s)", k, strings.Join(allowed, ", "))
		case len(vs) > 1:
			return nil, fmt.Errorf("query parameter %q given %d times", k, len(vs))
		}
	}
	return q, nil
}

// groupParam returns the group= parameter: "<share>/<filter>", with or without
// a leading "$share/", as the canonical group name.
func groupParam(q url.Values) (string, error) {
	vs, ok := q["group"]
	if !ok || vs[0] == "" {
		return "", errors.New(`missing query parameter "group" (a group name "<share>/<filter>", URL-encoded, e.g. group=workers%2Forders%2F%23)`)
	}
	n, err := share.ParseInput(vs[0])
	if err != nil {
		return "", fmt.Errorf("query parameter \"group\": %w (e.g. workers/orders/#; URL-encode '#' as %%23 and '+' as %%2B)", err)
	}
	return n.String(), nil
}

// uintParam returns a non-negative integer parameter and whether it was given.
func uintParam(q url.Values, name string) (uint64, bool, error) {
	vs, ok := q[name]
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.ParseUint(vs[0], 10, 64)
	if err != nil {
		return 0, true, fmt.Errorf("query parameter %q: %q is not a non-negative integer", name, vs[0])
	}
	return n, true, nil
}

// limitParam reads the "limit" query parameter: def when absent, else a
// number from 1 to max.
func limitParam(q url.Values, def, max uint64) (int, error) {
	limit, given, err := uintParam(q, "limit")
	switch {
	case err != nil:
		return 0, err
	case !given:
		return int(def), nil
	case limit < 1 || limit > max:
		return 0, fmt.Errorf("query parameter \"limit\": %d is not between 1 and %d", limit, max)
	}
	return int(limit), nil
}

func badRequest(w http.ResponseWriter, err error) {
	writeJSON(w, http.StatusBadRequest, adminapi.Error{Error: err.Error()})
}

// storeError answers err from an operation on group (and dead letter id).
func (a *groupAdmin) storeError(w http.ResponseWriter, err error, group string, id uint64) {
	status, msg := a.errorStatus(err, group, id)
	writeJSON(w, status, adminapi.Error{Error: msg})
}

func (a *groupAdmin) errorStatus(err error, group string, id uint64) (int, string) {
	switch {
	case errors.Is(err, keyshared.ErrGroupNotFound):
		msg := fmt.Sprintf("no group %q", group)
		if strings.HasSuffix(group, "/") || strings.Contains(group, " ") {
			msg += " (in a URL, write '#' as %23 and '+' as %2B)"
		}
		return http.StatusNotFound, msg
	case errors.Is(err, keyshared.ErrDeadLetterNotFound):
		return http.StatusNotFound, fmt.Sprintf("group %q has no dead letter with id %d", group, id)
	case errors.Is(err, keyshared.ErrBadGroupName):
		return http.StatusBadRequest, fmt.Sprintf("query parameter \"group\": %v", err)
	case errors.Is(err, hooks.ErrGroupBusy):
		ms := a.groups.Members(group)
		noun := "members"
		if len(ms) == 1 {
			noun = "member"
		}
		return http.StatusConflict, fmt.Sprintf("group %q has %d %s (%s); they must unsubscribe first", group, len(ms), noun, strings.Join(ms, ", "))
	case errors.Is(err, keyshared.ErrBacklogFull):
		return http.StatusConflict, fmt.Sprintf("group %q: backlog full: %v", group, err)
	case errors.Is(err, persistence.ErrClosed):
		return http.StatusServiceUnavailable, "the broker is shutting down"
	}
	a.s.log.Error("admin API", "group", group, "error", err)
	return http.StatusInternalServerError, err.Error()
}
