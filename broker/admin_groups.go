package broker

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/persistence"
)

// The Key-Shared admin API: groups and their dead letters under /api/v1.
// Groups are named by the query parameter group=<share>/<filter> (URL-encoded:
// '#' as %23, '+' as %2B) because names contain '/', '#' and '+'.

// GroupView is what the admin API shows of one Key-Shared group. Counters
// count since the group's dispatcher started (broker start or group creation).
type GroupView struct {
	Name     string    `json:"name"`
	Share    string    `json:"share"`
	Filter   string    `json:"filter"`
	Running  bool      `json:"running"` // a dispatcher serves the group
	Created  time.Time `json:"created"`
	LastSeen time.Time `json:"last_seen"` // when the group last had members
	Members  []string  `json:"members"`   // client ids, sorted

	Head            uint64 `json:"head"`             // last offset appended to the log
	Cursor          uint64 `json:"cursor"`           // every offset <= cursor is resolved
	PersistedCursor uint64 `json:"persisted_cursor"` // the cursor last saved (<= cursor)
	Backlog         uint64 `json:"backlog"`          // head - cursor: messages not resolved yet
	Lag             uint64 `json:"lag"`              // messages not yet read into the window
	InFlight        int    `json:"in_flight"`
	Blocked         int    `json:"blocked"` // in the window, not in flight
	BlockedKeys     int    `json:"blocked_keys"`
	PoisonedKeys    int    `json:"poisoned_keys"` // keys stopped by the block poison policy
	MembersAtLimit  int    `json:"members_at_limit"`
	DeadLetters     uint64 `json:"dead_letters"` // stored now
	StoredMessages  uint64 `json:"stored_messages"`
	StoredBytes     uint64 `json:"stored_bytes"`
	BacklogDropped  uint64 `json:"backlog_dropped"`  // dropped by the drop-oldest backlog policy (kept across restarts)
	BacklogRejected uint64 `json:"backlog_rejected"` // publishes refused at the backlog limit since start

	Counters GroupCounters `json:"counters"`
	QoS0     QoS0Counters  `json:"qos0"`
	// Rates are averaged since an earlier look at the group (an API call or a
	// metrics scrape) 1 s to 1 min ago; null until there is one.
	Rates *GroupRates `json:"rates"`

	// Detail only.
	Settings  *GroupSettingsView `json:"settings,omitempty"`
	PerMember []MemberView       `json:"per_member,omitempty"`
}

// GroupCounters count a group's dispatch outcomes.
type GroupCounters struct {
	Delivered    uint64 `json:"delivered"`    // deliveries, first ones and retries
	Redeliveries uint64 `json:"redeliveries"` // deliveries after the first of the same message
	Acked        uint64 `json:"acked"`
	Nacks        uint64 `json:"nacks"`   // nacks asking for a retry
	Rejects      uint64 `json:"rejects"` // nacks with a never-retry reason code
	Timeouts     uint64 `json:"timeouts"`
	MemberLosses uint64 `json:"member_losses"` // in-flight messages requeued because their member left
	DeadLettered uint64 `json:"dead_lettered"`
	Dropped      uint64 `json:"dropped"` // by the drop poison policy
	Expired      uint64 `json:"expired"`
	Skipped      uint64 `json:"skipped"` // no member's key filters match
	Evictions    uint64 `json:"evictions"`
	Refused      uint64 `json:"refused"` // deliveries a member could not take (not attempts)
	StaleAcks    uint64 `json:"stale_acks"`
	StoreErrors  uint64 `json:"store_errors"`
}

// QoS0Counters count a group's QoS 0 (non-reliable) routing.
type QoS0Counters struct {
	Routed  uint64 `json:"routed"`
	Dropped uint64 `json:"dropped"` // the member's queue had no room
	Skipped uint64 `json:"skipped"` // no member could take it
}

// GroupRates are per-second rates over WindowSeconds.
type GroupRates struct {
	WindowSeconds float64 `json:"window_seconds"`
	Published     float64 `json:"published_per_sec"` // appended to the log (replays included)
	Delivered     float64 `json:"delivered_per_sec"`
	Acked         float64 `json:"acked_per_sec"`
	DeadLettered  float64 `json:"dead_lettered_per_sec"`
}

// GroupSettingsView shows the settings a group runs with.
type GroupSettingsView struct {
	AckTimeout         string   `json:"ack_timeout"`
	MaxDeliveries      int      `json:"max_deliveries"`
	PoisonPolicy       string   `json:"poison_policy"`
	RetryBackoff       []string `json:"retry_backoff"`
	MemberMaxInflight  int      `json:"member_max_inflight"`
	Window             int      `json:"window"`
	BacklogMaxMessages uint64   `json:"backlog_max_messages"` // 0: no limit
	BacklogMaxBytes    uint64   `json:"backlog_max_bytes"`    // 0: no limit
	BacklogPolicy      string   `json:"backlog_policy"`
}

// MemberView is one member of a group.
type MemberView struct {
	ID         string   `json:"id"`
	Connected  bool     `json:"connected"`
	Active     bool     `json:"active"` // false: disconnected, evicted unless it returns
	QoS        byte     `json:"qos"`    // granted
	KeyFilters []string `json:"key_filters"`
	InFlight   int      `json:"in_flight"`
	Limit      int      `json:"limit"` // in-flight limit
	AtLimit    bool     `json:"at_limit"`
}

// DeadLetterView is one dead letter. Payload is the payload as a string when
// it is valid UTF-8 (PayloadEncoding "utf-8"), else base64 ("base64").
type DeadLetterView struct {
	ID              uint64             `json:"id"`
	Offset          uint64             `json:"offset"` // its offset in the group log when it was dead-lettered
	Key             string             `json:"key"`
	Topic           string             `json:"topic"`
	QoS             byte               `json:"qos"`
	Payload         string             `json:"payload"`
	PayloadEncoding string             `json:"payload_encoding"`
	PayloadSize     int                `json:"payload_size"`
	PayloadFormat   *byte              `json:"payload_format,omitempty"`
	ContentType     string             `json:"content_type,omitempty"`
	ResponseTopic   string             `json:"response_topic,omitempty"`
	CorrelationData string             `json:"correlation_data,omitempty"` // base64
	UserProperties  []UserPropertyView `json:"user_properties"`
	Attempts        int                `json:"attempts"`
	ReasonCode      byte               `json:"reason_code"` // last MQTT reason code; 0: ack timeout or member lost
	Reason          string             `json:"reason"`
	PublishedAt     time.Time          `json:"published_at"`
	ExpiresAt       time.Time          `json:"expires_at,omitzero"`
	FirstDelivery   time.Time          `json:"first_delivery,omitzero"`
	LastDelivery    time.Time          `json:"last_delivery,omitzero"`
	DeadAt          time.Time          `json:"dead_at"`
}

// UserPropertyView is one MQTT 5 user property (they may repeat, so they are a list).
type UserPropertyView struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// DeadLetterPage is one page of GET /api/v1/dlq.
type DeadLetterPage struct {
	Group       string           `json:"group"`
	DeadLetters []DeadLetterView `json:"dead_letters"`
	Total       uint64           `json:"total"` // dead letters the group holds
	// More reports whether more follow; pass NextAfter as after= for them.
	More      bool   `json:"more"`
	NextAfter uint64 `json:"next_after,omitempty"`
}

// ReplayedLetter is one replayed dead letter and its new log offset.
type ReplayedLetter struct {
	ID     uint64 `json:"id"`
	Offset uint64 `json:"offset"`
	Key    string `json:"key"`
	Topic  string `json:"topic"`
}

// ReplayResult answers POST /api/v1/dlq/replay. When a replay fails part way,
// Error says why and Replayed lists what was replayed before.
type ReplayResult struct {
	Error    string           `json:"error,omitempty"`
	Group    string           `json:"group"`
	Count    int              `json:"count"`
	Replayed []ReplayedLetter `json:"replayed"`
	// Truncated: Replayed lists only the first maxListedReplays of Count.
	Truncated bool `json:"truncated,omitempty"`
}

// PurgeResult answers POST /api/v1/dlq/purge.
type PurgeResult struct {
	Group  string `json:"group"`
	Purged int    `json:"purged"`
}

// DeleteGroupResult answers DELETE /api/v1/groups: what the group held.
type DeleteGroupResult struct {
	Deleted     string `json:"deleted"`
	Backlog     uint64 `json:"backlog"`
	DeadLetters uint64 `json:"dead_letters"`
}

const (
	defaultDLQLimit  = 100
	maxDLQLimit      = 1000
	maxListedReplays = 1000
)

// groupAdmin serves the group and dead-letter routes and feeds the group
// metrics; both share its rate samples.
type groupAdmin struct {
	b     *Broker
	rates rateTracker
}

func newGroupAdmin(b *Broker) *groupAdmin { return &groupAdmin{b: b} }

// register adds the group and dead-letter routes to mux, and a JSON 404/405
// for any other /api/v1 path.
func (a *groupAdmin) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/v1/groups", a.handleGroups)
	mux.HandleFunc("GET /api/v1/groups/detail", a.handleGroupDetail)
	mux.HandleFunc("DELETE /api/v1/groups", a.handleDeleteGroup)
	mux.HandleFunc("GET /api/v1/dlq", a.handleDeadLetters)
	mux.HandleFunc("POST /api/v1/dlq/replay", a.handleReplay)
	mux.HandleFunc("POST /api/v1/dlq/purge", a.handlePurge)
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
			writeJSON(w, http.StatusMethodNotAllowed, apiError{Error: fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allow, ", "))})
			return
		}
		writeJSON(w, http.StatusNotFound, apiError{Error: "no API endpoint " + r.URL.Path})
	})
}

// openPaths are served without the admin token.
var openPaths = map[string]bool{"/metrics": true, "/healthz": true, "/readyz": true}

// adminHandler guards next: every path but /metrics, /healthz and /readyz
// needs the bearer token when one is configured, and state-changing
// cross-origin browser requests are refused (CSRF).
func (b *Broker) adminHandler(next http.Handler) http.Handler {
	csrf := http.NewCrossOriginProtection()
	csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusForbidden, apiError{Error: "cross-origin request refused"})
	}))
	next = csrf.Handler(next)
	token := []byte(b.cfg.HTTPToken)
	if len(token) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if openPaths[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		switch {
		case !ok || !strings.EqualFold(scheme, "Bearer"):
			w.Header().Set("WWW-Authenticate", `Bearer realm="keyline"`)
			writeJSON(w, http.StatusUnauthorized, apiError{Error: "missing bearer token: send Authorization: Bearer <http-token>"})
		case subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), token) != 1:
			w.Header().Set("WWW-Authenticate", `Bearer realm="keyline", error="invalid_token"`)
			writeJSON(w, http.StatusUnauthorized, apiError{Error: "wrong bearer token"})
		default:
			next.ServeHTTP(w, r)
		}
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
	st, err := a.b.keyShared.Group(name)
	if err != nil {
		a.storeError(w, err, name, 0)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if err := a.b.keyShared.DeleteGroup(ctx, name); err != nil {
		a.storeError(w, err, name, 0)
		return
	}
	a.b.log.Info("deleted group through the admin API", "group", name, "backlog", st.Info.Backlog, "dead_letters", st.Info.DeadLetters, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, DeleteGroupResult{Deleted: name, Backlog: st.Info.Backlog, DeadLetters: st.Info.DeadLetters})
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
	limit, given, err := uintParam(q, "limit")
	if err != nil {
		badRequest(w, err)
		return
	}
	if !given {
		limit = defaultDLQLimit
	} else if limit < 1 || limit > maxDLQLimit {
		badRequest(w, fmt.Errorf("query parameter \"limit\": %d is not between 1 and %d", limit, maxDLQLimit))
		return
	}
	store := a.b.keyShared.Store()
	info, err := store.Group(name)
	if err != nil {
		a.storeError(w, err, name, 0)
		return
	}
	entries, err := store.DeadLetters(name, after, int(limit)+1)
	if err != nil {
		a.storeError(w, err, name, 0)
		return
	}
	page := DeadLetterPage{Group: name, Total: info.DeadLetters, DeadLetters: []DeadLetterView{}}
	if len(entries) > int(limit) {
		entries = entries[:limit]
		page.More, page.NextAfter = true, entries[len(entries)-1].ID
	}
	for _, e := range entries {
		page.DeadLetters = append(page.DeadLetters, deadLetterView(e))
	}
	writeJSON(w, http.StatusOK, page)
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
	store := a.b.keyShared.Store()
	var todo []ReplayedLetter // offsets filled in as they are replayed
	if one {
		e, err := store.DeadLetter(name, id)
		if err != nil {
			a.storeError(w, err, name, id)
			return
		}
		todo = append(todo, ReplayedLetter{ID: e.ID, Key: e.Message.Key, Topic: e.Message.Topic})
	} else {
		// Replay what is there now: a letter that dies again meanwhile gets a new id and waits.
		for after := uint64(0); ; {
			page, err := store.DeadLetters(name, after, 512)
			if err != nil {
				a.storeError(w, err, name, 0)
				return
			}
			if len(page) == 0 {
				break
			}
			for _, e := range page {
				todo = append(todo, ReplayedLetter{ID: e.ID, Key: e.Message.Key, Topic: e.Message.Topic})
			}
			after = page[len(page)-1].ID
		}
	}
	res := ReplayResult{Group: name, Replayed: []ReplayedLetter{}}
	for _, rl := range todo {
		if r.Context().Err() != nil {
			break // the client went away: stop between replays, each is atomic
		}
		off, err := store.ReplayDeadLetter(name, rl.ID)
		if errors.Is(err, persistence.ErrDeadLetterNotFound) && !one {
			continue // replayed or purged meanwhile
		}
		if err != nil {
			status, msg := a.errorStatus(err, name, rl.ID)
			if res.Count > 0 {
				msg = fmt.Sprintf("%s (after replaying %d)", msg, res.Count)
			}
			res.Error = msg
			writeJSON(w, status, res)
			return
		}
		res.Count++
		if len(res.Replayed) < maxListedReplays {
			rl.Offset = off
			res.Replayed = append(res.Replayed, rl)
		} else {
			res.Truncated = true
		}
	}
	if res.Count > 0 {
		a.b.log.Info("replayed dead letters through the admin API", "group", name, "count", res.Count, "remote", r.RemoteAddr)
	}
	writeJSON(w, http.StatusOK, res)
}

func (a *groupAdmin) handlePurge(w http.ResponseWriter, r *http.Request) {
	name, id, one, err := dlqTarget(r)
	if err != nil {
		badRequest(w, err)
		return
	}
	store := a.b.keyShared.Store()
	res := PurgeResult{Group: name}
	if one {
		err = store.DeleteDeadLetter(name, id)
		res.Purged = 1
	} else {
		res.Purged, err = store.PurgeDeadLetters(name)
	}
	if err != nil {
		a.storeError(w, err, name, id)
		return
	}
	a.b.log.Info("purged dead letters through the admin API", "group", name, "count", res.Purged, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, res)
}

// --- views ---

// GroupViews lists every Key-Shared group, sorted by name.
func (a *groupAdmin) groupViews() ([]GroupView, error) {
	sts, err := a.b.keyShared.Groups()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]GroupView, 0, len(sts))
	names := make(map[string]bool, len(sts))
	for _, st := range sts {
		out = append(out, a.groupView(st, now))
		names[st.Info.Name] = true
	}
	a.rates.retain(names)
	return out, nil
}

// GroupDetail returns one group with its settings and per-member figures.
func (a *groupAdmin) groupDetail(name string) (GroupView, error) {
	st, err := a.b.keyShared.Group(name)
	if err != nil {
		return GroupView{}, err
	}
	v := a.groupView(st, time.Now())
	s := a.b.cfg.settingsFor(name)
	v.Settings = &GroupSettingsView{
		AckTimeout: s.AckTimeout.String(), MaxDeliveries: s.MaxDeliveries, PoisonPolicy: s.PoisonPolicy.String(),
		MemberMaxInflight: s.MemberMaxInflight, Window: s.Window,
		BacklogMaxMessages: st.Info.Config.MaxMessages, BacklogMaxBytes: st.Info.Config.MaxBytes,
		BacklogPolicy: st.Info.Config.Policy.String(),
	}
	if v.Settings.BacklogPolicy == "" {
		v.Settings.BacklogPolicy = persistence.PolicyReject.String()
	}
	for _, d := range s.RetryBackoff {
		v.Settings.RetryBackoff = append(v.Settings.RetryBackoff, d.String())
	}
	// Members the hook knows (subscribed) and members the dispatcher holds
	// (live, possibly waiting for eviction) are the same set but for moments
	// in between; show the union.
	v.PerMember = []MemberView{}
	index := map[string]int{}
	member := func(id string) *MemberView {
		i, ok := index[id]
		if !ok {
			i = len(v.PerMember)
			index[id] = i
			v.PerMember = append(v.PerMember, MemberView{ID: id, KeyFilters: []string{}})
		}
		return &v.PerMember[i]
	}
	for _, mi := range a.b.keyShared.MemberInfos(name) {
		m := member(mi.ID)
		m.Connected, m.QoS = mi.Connected, mi.QoS
		if len(mi.KeyFilters) > 0 {
			m.KeyFilters = mi.KeyFilters
		}
	}
	for _, ms := range st.Stats.PerMember {
		m := member(ms.ID)
		m.Active, m.InFlight, m.Limit = ms.Active, ms.InFlight, ms.Limit
		m.AtLimit = ms.Limit > 0 && ms.InFlight >= ms.Limit
	}
	sort.Slice(v.PerMember, func(i, j int) bool { return v.PerMember[i].ID < v.PerMember[j].ID })
	return v, nil
}

// groupView combines a group's stored and live figures. The head comes from
// the store (current as of the last commit), the cursor from the dispatcher.
func (a *groupAdmin) groupView(st hooks.GroupStatus, now time.Time) GroupView {
	gi, s := st.Info, st.Stats
	v := GroupView{
		Name: gi.Name, Share: gi.Share, Filter: gi.Filter, Running: st.Running,
		Created: gi.Created, LastSeen: gi.LastSeen,
		Members: a.b.keyShared.Members(gi.Name),
		Head:    max(gi.Head, s.Head), Cursor: gi.Cursor, PersistedCursor: gi.Cursor,
		DeadLetters: gi.DeadLetters, StoredMessages: gi.StoredMessages, StoredBytes: gi.StoredBytes,
		BacklogDropped: gi.Dropped, BacklogRejected: gi.Rejected,
	}
	if v.Members == nil {
		v.Members = []string{}
	}
	if st.Running {
		v.Cursor = max(s.Cursor, gi.Cursor)
		v.Lag, v.InFlight, v.Blocked, v.BlockedKeys = s.Lag, s.InFlight, s.Blocked, s.BlockedKeys
		v.PoisonedKeys, v.MembersAtLimit = s.PoisonedKeys, s.MembersAtLimit
		v.Counters = GroupCounters{
			Delivered: s.Delivered, Redeliveries: s.Redeliveries, Acked: s.Acked, Nacks: s.Nacks,
			Rejects: s.Rejects, Timeouts: s.Timeouts, MemberLosses: s.MemberLosses,
			DeadLettered: s.DeadLettered, Dropped: s.Dropped, Expired: s.Expired, Skipped: s.Skipped,
			Evictions: s.Evictions, Refused: s.Refused, StaleAcks: s.StaleAcks, StoreErrors: s.StoreErrors,
		}
		v.QoS0 = QoS0Counters{Routed: st.QoS0.Delivered, Dropped: st.QoS0.Dropped, Skipped: st.QoS0.Skipped}
	} else {
		v.Lag = gi.Backlog
	}
	if v.Head > v.Cursor {
		v.Backlog = v.Head - v.Cursor
	}
	v.Rates = a.rates.observe(gi.Name, rateSample{
		at: now, head: v.Head, delivered: v.Counters.Delivered, acked: v.Counters.Acked, dead: v.Counters.DeadLettered,
	})
	return v
}

func deadLetterView(e persistence.DeadLetterEntry) DeadLetterView {
	m := e.Message
	v := DeadLetterView{
		ID: e.ID, Offset: m.Offset, Key: m.Key, Topic: m.Topic, QoS: m.QoS, PayloadSize: len(m.Payload),
		ContentType: m.Props.ContentType, ResponseTopic: m.Props.ResponseTopic,
		UserProperties: make([]UserPropertyView, 0, len(m.Props.User)),
		Attempts:       e.Attempts, ReasonCode: e.Reason, Reason: reasonText(e.Reason),
		PublishedAt: m.PublishedAt, ExpiresAt: m.ExpiresAt,
		FirstDelivery: e.FirstDelivery, LastDelivery: e.LastDelivery, DeadAt: e.DeadAt,
	}
	if utf8.Valid(m.Payload) {
		v.Payload, v.PayloadEncoding = string(m.Payload), "utf-8"
	} else {
		v.Payload, v.PayloadEncoding = base64.StdEncoding.EncodeToString(m.Payload), "base64"
	}
	if m.Props.PayloadFormatSet {
		f := m.Props.PayloadFormat
		v.PayloadFormat = &f
	}
	if len(m.Props.CorrelationData) > 0 {
		v.CorrelationData = base64.StdEncoding.EncodeToString(m.Props.CorrelationData)
	}
	for _, u := range m.Props.User {
		v.UserProperties = append(v.UserProperties, UserPropertyView{Key: u.Key, Value: u.Val})
	}
	return v
}

// reasonText names the reason code a dead letter's last attempt ended with.
func reasonText(code byte) string {
	names := map[byte]string{
		0x00: "no reason code: ack timeout or member lost",
		0x80: "unspecified error", 0x83: "implementation specific error", 0x87: "not authorized",
		0x90: "topic name invalid", 0x91: "packet identifier in use", 0x97: "quota exceeded",
		0x99: "payload format invalid",
	}
	if n, ok := names[code]; ok {
		return fmt.Sprintf("0x%02x %s", code, n)
	}
	return fmt.Sprintf("0x%02x", code)
}

// --- parameters and errors ---

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
// a leading "$share/".
func groupParam(q url.Values) (string, error) {
	vs, ok := q["group"]
	if !ok || vs[0] == "" {
		return "", errors.New(`missing query parameter "group" (a group name "<share>/<filter>", URL-encoded, e.g. group=workers%2Forders%2F%23)`)
	}
	name := strings.TrimPrefix(vs[0], "$share/")
	share, filter, found := strings.Cut(name, "/")
	switch {
	case !found || share == "" || filter == "":
		return "", fmt.Errorf("query parameter \"group\": %q is not \"<share>/<filter>\" (e.g. workers/orders/#; URL-encode '#' as %%23 and '+' as %%2B)", vs[0])
	case strings.ContainsAny(share, "+#"):
		return "", fmt.Errorf("query parameter \"group\": share name %q contains '+' or '#'", share)
	}
	return name, nil
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

func badRequest(w http.ResponseWriter, err error) {
	writeJSON(w, http.StatusBadRequest, apiError{Error: err.Error()})
}

// storeError answers err from an operation on group (and dead letter id).
func (a *groupAdmin) storeError(w http.ResponseWriter, err error, group string, id uint64) {
	status, msg := a.errorStatus(err, group, id)
	writeJSON(w, status, apiError{Error: msg})
}

func (a *groupAdmin) errorStatus(err error, group string, id uint64) (int, string) {
	switch {
	case errors.Is(err, persistence.ErrGroupNotFound):
		msg := fmt.Sprintf("no group %q", group)
		if strings.HasSuffix(group, "/") || strings.Contains(group, " ") {
			msg += " (in a URL, write '#' as %23 and '+' as %2B)"
		}
		return http.StatusNotFound, msg
	case errors.Is(err, persistence.ErrDeadLetterNotFound):
		return http.StatusNotFound, fmt.Sprintf("group %q has no dead letter with id %d", group, id)
	case errors.Is(err, persistence.ErrBadGroupName):
		return http.StatusBadRequest, fmt.Sprintf("query parameter \"group\": %v", err)
	case errors.Is(err, hooks.ErrGroupBusy):
		ms := a.b.keyShared.Members(group)
		noun := "members"
		if len(ms) == 1 {
			noun = "member"
		}
		return http.StatusConflict, fmt.Sprintf("group %q has %d %s (%s); they must unsubscribe first", group, len(ms), noun, strings.Join(ms, ", "))
	case errors.Is(err, persistence.ErrBacklogFull):
		return http.StatusConflict, fmt.Sprintf("group %q: backlog full: %v", group, err)
	case errors.Is(err, persistence.ErrClosed):
		return http.StatusServiceUnavailable, "the broker is shutting down"
	}
	a.b.log.Error("admin API", "group", group, "error", err)
	return http.StatusInternalServerError, err.Error()
}

// --- rates ---

// rateTracker keeps recent samples of each group's counters, taken whenever
// the API or a metrics scrape looks at the group, to derive rates cheaply.
type rateTracker struct {
	mu      sync.Mutex
	samples map[string][]rateSample // oldest first, at least rateMinSpan apart
}

type rateSample struct {
	at                           time.Time
	head, delivered, acked, dead uint64
}

const (
	rateMinSpan = time.Second
	rateMaxAge  = time.Minute
)

// observe records s for group and returns the rates since the oldest sample
// kept, nil if there is none rateMinSpan old.
func (t *rateTracker) observe(group string, s rateSample) *GroupRates {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.samples == nil {
		t.samples = map[string][]rateSample{}
	}
	ss := t.samples[group]
	if n := len(ss); n > 0 {
		last := ss[n-1]
		if s.head < last.head || s.delivered < last.delivered || s.acked < last.acked || s.dead < last.dead {
			ss = ss[:0] // the group or its dispatcher started over
		}
	}
	// Drop samples too old to matter, keeping the newest of them as the base.
	for len(ss) > 1 && !ss[1].at.After(s.at.Add(-rateMaxAge)) {
		ss = ss[1:]
	}
	var rates *GroupRates
	if len(ss) > 0 {
		if span := s.at.Sub(ss[0].at); span >= rateMinSpan {
			base, sec := ss[0], span.Seconds()
			rates = &GroupRates{
				WindowSeconds: sec,
				Published:     float64(s.head-base.head) / sec,
				Delivered:     float64(s.delivered-base.delivered) / sec,
				Acked:         float64(s.acked-base.acked) / sec,
				DeadLettered:  float64(s.dead-base.dead) / sec,
			}
		}
	}
	if len(ss) == 0 || s.at.Sub(ss[len(ss)-1].at) >= rateMinSpan {
		ss = append(ss, s)
	}
	t.samples[group] = ss
	return rates
}

// retain forgets the groups not in names.
func (t *rateTracker) retain(names map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for g := range t.samples {
		if !names[g] {
			delete(t.samples, g)
		}
	}
}
