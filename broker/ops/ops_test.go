package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The operator surface runs here on a fake broker: no mochi, no store.

type fakeBroker struct {
	mu        sync.Mutex
	figures   Figures
	clients   map[string]adminapi.ClientDetail
	connected map[string]bool
	retained  []Message
	groups    *fakeGroups
	ready     bool
}

func newFakeBroker() *fakeBroker {
	return &fakeBroker{clients: map[string]adminapi.ClientDetail{}, connected: map[string]bool{}, groups: newFakeGroups(), ready: true}
}

func (f *fakeBroker) Figures() Figures {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.figures
}

func (f *fakeBroker) Clients() []adminapi.ClientView {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []adminapi.ClientView
	for _, d := range f.clients {
		out = append(out, d.ClientView)
	}
	slices.SortFunc(out, func(a, b adminapi.ClientView) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (f *fakeBroker) Client(id string) (adminapi.ClientDetail, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.clients[id]
	if !ok {
		return d, &adminapi.StatusError{Status: http.StatusNotFound, Message: fmt.Sprintf("no client with id %q", id)}
	}
	return d, nil
}

func (f *fakeBroker) Disconnect(id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.clients[id]; !ok {
		return false, &adminapi.StatusError{Status: http.StatusNotFound, Message: "no client"}
	}
	if !f.connected[id] {
		return false, &adminapi.StatusError{Status: http.StatusConflict, Message: "not connected"}
	}
	f.connected[id] = false
	return true, nil
}

func (f *fakeBroker) Retained(string) []Message { return f.retained }
func (f *fakeBroker) Groups() Groups            { return f.groups }
func (f *fakeBroker) Bridges() []adminapi.BridgeView {
	return []adminapi.BridgeView{{Name: "up", State: "connected"}}
}
func (f *fakeBroker) NotReady() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ready {
		return errors.New("starting")
	}
	return nil
}

type fakeGroup struct {
	st      hooks.GroupStatus
	members []string
	dead    []persistence.DeadLetterEntry
}

type fakeGroups struct {
	mu       sync.Mutex
	m        map[string]*fakeGroup
	replayed []uint64
}

func newFakeGroups() *fakeGroups { return &fakeGroups{m: map[string]*fakeGroup{}} }

func (g *fakeGroups) add(name string, head, cursor uint64, members []string, dead int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	share, filter, _ := strings.Cut(name, "/")
	fg := &fakeGroup{members: members}
	fg.st.Info = persistence.GroupInfo{Name: name, Share: share, Filter: filter, Head: head, Cursor: cursor, Backlog: head - cursor,
		Config: persistence.GroupConfig{MaxMessages: 500, Policy: persistence.PolicyReject}}
	fg.st.Running = true
	fg.st.Stats = keyshared.Stats{Head: head, Cursor: cursor, Delivered: head, Acked: cursor}
	for i := range dead {
		fg.dead = append(fg.dead, persistence.DeadLetterEntry{ID: uint64(i + 1), DeadLetter: keyshared.DeadLetter{
			Group: name, Message: keyshared.Message{Key: fmt.Sprint("k", i), Topic: filter, Payload: []byte{0xff, byte(i)}}, Reason: 0x87}})
	}
	fg.st.Info.DeadLetters = uint64(dead)
	g.m[name] = fg
}

func (g *fakeGroups) get(name string) (*fakeGroup, error) {
	fg := g.m[name]
	if fg == nil {
		return nil, persistence.ErrGroupNotFound
	}
	return fg, nil
}

func (g *fakeGroups) Groups() ([]hooks.GroupStatus, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []hooks.GroupStatus
	for _, fg := range g.m {
		out = append(out, fg.st)
	}
	slices.SortFunc(out, func(a, b hooks.GroupStatus) int { return strings.Compare(a.Info.Name, b.Info.Name) })
	return out, nil
}

func (g *fakeGroups) Group(name string) (hooks.GroupStatus, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	fg, err := g.get(name)
	if err != nil {
		return hooks.GroupStatus{}, err
	}
	return fg.st, nil
}

func (g *fakeGroups) DeleteGroup(_ context.Context, name string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	fg, err := g.get(name)
	if err != nil {
		return err
	}
	if len(fg.members) > 0 {
		return hooks.ErrGroupBusy
	}
	delete(g.m, name)
	return nil
}

func (g *fakeGroups) Members(name string) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if fg := g.m[name]; fg != nil {
		return fg.members
	}
	return nil
}

func (g *fakeGroups) MemberInfos(name string) []hooks.MemberInfo {
	var out []hooks.MemberInfo
	for _, m := range g.Members(name) {
		out = append(out, hooks.MemberInfo{ID: m, QoS: 1, Connected: true, KeyFilters: []string{"a*"}})
	}
	return out
}

func (g *fakeGroups) DeadLetters(name string, after uint64, limit int) ([]persistence.DeadLetterEntry, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	fg, err := g.get(name)
	if err != nil {
		return nil, err
	}
	var out []persistence.DeadLetterEntry
	for _, e := range fg.dead {
		if e.ID > after && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

func (g *fakeGroups) DeadLetter(name string, id uint64) (persistence.DeadLetterEntry, error) {
	es, err := g.DeadLetters(name, id-1, 1)
	if err != nil {
		return persistence.DeadLetterEntry{}, err
	}
	if len(es) == 0 || es[0].ID != id {
		return persistence.DeadLetterEntry{}, persistence.ErrDeadLetterNotFound
	}
	return es[0], nil
}

func (g *fakeGroups) ReplayDeadLetter(name string, id uint64) (uint64, error) {
	if err := g.DeleteDeadLetter(name, id); err != nil {
		return 0, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.replayed = append(g.replayed, id)
	return 100 + id, nil
}

func (g *fakeGroups) DeleteDeadLetter(name string, id uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	fg, err := g.get(name)
	if err != nil {
		return err
	}
	for i, e := range fg.dead {
		if e.ID == id {
			fg.dead = slices.Delete(fg.dead, i, i+1)
			fg.st.Info.DeadLetters--
			return nil
		}
	}
	return persistence.ErrDeadLetterNotFound
}

func (g *fakeGroups) PurgeDeadLetters(name string) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	fg, err := g.get(name)
	if err != nil {
		return 0, err
	}
	n := len(fg.dead)
	fg.dead, fg.st.Info.DeadLetters = nil, 0
	return n, nil
}

func (g *fakeGroups) Pending(_ context.Context, name string, limit int) (hooks.GroupStatus, []hooks.PendingMessage, bool, error) {
	st, err := g.Group(name)
	if err != nil {
		return st, nil, false, err
	}
	var msgs []hooks.PendingMessage
	for off := st.Info.Cursor + 1; off <= st.Info.Head && len(msgs) < limit; off++ {
		msgs = append(msgs, hooks.PendingMessage{Message: keyshared.Message{Offset: off, Key: "k", Topic: "t", Payload: []byte("p")}})
	}
	return st, msgs, st.Info.Head-st.Info.Cursor > uint64(limit), nil
}

// serve runs the operator surface of f on a real HTTP server on loopback.
func serve(t *testing.T, f *fakeBroker, cfg Config) (*Service, string) {
	t.Helper()
	if cfg.Settings == nil {
		cfg.Settings = func(string) adminapi.GroupSettingsView {
			return adminapi.GroupSettingsView{AckTimeout: "30s", MaxDeliveries: 5, PoisonPolicy: "dead-letter"}
		}
	}
	s := New(f, cfg)
	s.Start()
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		s.Stop()
		srv.Close()
	})
	return s, srv.URL
}

func call(t *testing.T, method, u string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func callJSON(t *testing.T, method, u string, want int, out any) {
	t.Helper()
	code, body := call(t, method, u)
	if code != want {
		t.Fatalf("%s %s = %d %s, want %d", method, u, code, body, want)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(body), out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, u, err, body)
		}
	}
}

func groupQuery(name string, kv ...string) string {
	q := url.Values{"group": {name}}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return "?" + q.Encode()
}

// TestGroupsAndDeadLettersAPI: the group routes answer from the group
// service, with the settings, members and errors the API promises.
func TestGroupsAndDeadLettersAPI(t *testing.T) {
	f := newFakeBroker()
	f.groups.add("w/jobs/#", 10, 4, []string{"m1", "m2"}, 5)
	f.groups.add("idle/x", 3, 3, nil, 0)
	_, base := serve(t, f, Config{})

	var gl adminapi.GroupList
	callJSON(t, "GET", base+adminapi.PathGroups, 200, &gl)
	if len(gl.Groups) != 2 || gl.Groups[1].Name != "w/jobs/#" || gl.Groups[1].Backlog != 6 || len(gl.Groups[1].Members) != 2 {
		t.Fatalf("groups %+v", gl.Groups)
	}
	var gv adminapi.GroupView
	callJSON(t, "GET", base+adminapi.PathGroupDetail+groupQuery("w/jobs/#"), 200, &gv)
	if gv.Settings == nil || gv.Settings.AckTimeout != "30s" || gv.Settings.BacklogMaxMessages != 500 || gv.Settings.BacklogPolicy != "reject" ||
		len(gv.PerMember) != 2 || gv.PerMember[0].KeyFilters[0] != "a*" {
		t.Fatalf("detail %+v %+v", gv.Settings, gv.PerMember)
	}
	if code, body := call(t, "GET", base+adminapi.PathGroupDetail+groupQuery("no/such")); code != 404 || !strings.Contains(body, `no group \"no/such\"`) {
		t.Errorf("unknown group: %d %s", code, body)
	}
	if code, body := call(t, "GET", base+adminapi.PathGroupDetail+"?group=w%2Fjobs%2F%23&x=1"); code != 400 || !strings.Contains(body, `unknown query parameter \"x\"`) {
		t.Errorf("unknown parameter: %d %s", code, body)
	}
	if code, body := call(t, "DELETE", base+adminapi.PathGroups+groupQuery("w/jobs/#")); code != 409 || !strings.Contains(body, "2 members (m1, m2)") {
		t.Errorf("deleting a group with members: %d %s", code, body)
	}
	var del adminapi.DeleteGroupResult
	callJSON(t, "DELETE", base+adminapi.PathGroups+groupQuery("idle/x"), 200, &del)
	if del.Deleted != "idle/x" {
		t.Errorf("delete %+v", del)
	}

	var page adminapi.DeadLetterPage
	callJSON(t, "GET", base+adminapi.PathDLQ+groupQuery("w/jobs/#", "limit", "2"), 200, &page)
	if page.Total != 5 || len(page.DeadLetters) != 2 || !page.More || page.NextAfter != 2 || page.DeadLetters[0].PayloadEncoding != "base64" ||
		page.DeadLetters[0].Reason != "0x87 not authorized" {
		t.Fatalf("page %+v", page)
	}
	var rr adminapi.ReplayResult
	callJSON(t, "POST", base+adminapi.PathDLQReplay+groupQuery("w/jobs/#", "id", "2"), 200, &rr)
	if rr.Count != 1 || rr.Replayed[0].Offset != 102 {
		t.Fatalf("replay one %+v", rr)
	}
	if code, body := call(t, "POST", base+adminapi.PathDLQReplay+groupQuery("w/jobs/#", "id", "2")); code != 404 || !strings.Contains(body, "no dead letter with id 2") {
		t.Errorf("replaying it again: %d %s", code, body)
	}
	callJSON(t, "POST", base+adminapi.PathDLQReplay+groupQuery("w/jobs/#"), 200, &rr)
	if rr.Count != 4 || !slices.Equal(f.groups.replayed, []uint64{2, 1, 3, 4, 5}) {
		t.Fatalf("replay all %+v, replayed %v", rr, f.groups.replayed)
	}
	var pr adminapi.PurgeResult
	callJSON(t, "POST", base+adminapi.PathDLQPurge+groupQuery("w/jobs/#"), 200, &pr)
	if pr.Purged != 0 {
		t.Errorf("purge %+v", pr)
	}
	if code, body := call(t, "PUT", base+adminapi.PathGroups); code != 405 || !strings.Contains(body, "allowed: GET, DELETE") {
		t.Errorf("PUT: %d %s", code, body)
	}
}

// TestClientsAPI: the client routes show what the broker reports and
// disconnect through it.
func TestClientsAPI(t *testing.T) {
	f := newFakeBroker()
	f.clients["c1"] = adminapi.ClientDetail{ClientView: adminapi.ClientView{ID: "c1", Connected: true, QueuedBytes: 100}}
	f.clients["c2"] = adminapi.ClientDetail{ClientView: adminapi.ClientView{ID: "c2", QueuedBytes: 20}}
	f.connected["c1"] = true
	_, base := serve(t, f, Config{})
	var cl struct{ Clients []adminapi.ClientView }
	callJSON(t, "GET", base+adminapi.PathClients, 200, &cl)
	if len(cl.Clients) != 2 || cl.Clients[0].ID != "c1" {
		t.Fatalf("clients %+v", cl)
	}
	if code, _ := call(t, "GET", base+adminapi.PathClients+"/ghost"); code != 404 {
		t.Errorf("unknown client: %d", code)
	}
	var dr adminapi.DisconnectResult
	callJSON(t, "POST", base+adminapi.PathClients+"/c1/disconnect", 200, &dr)
	if dr.Disconnected != "c1" || !dr.SessionKept {
		t.Errorf("disconnect %+v", dr)
	}
	if code, _ := call(t, "POST", base+adminapi.PathClients+"/c1/disconnect"); code != 409 {
		t.Errorf("disconnecting it again: %d", code)
	}
	var bl adminapi.BridgeList
	callJSON(t, "GET", base+adminapi.PathBridges, 200, &bl)
	if len(bl.Bridges) != 1 || bl.Bridges[0].Name != "up" {
		t.Errorf("bridges %+v", bl)
	}
	if code, _ := call(t, "GET", base+adminapi.PathBridges+"/down"); code != 404 {
		t.Errorf("unknown bridge: %d", code)
	}
	var ov adminapi.OverviewView
	callJSON(t, "GET", base+adminapi.PathOverview, 200, &ov)
	if ov.QueuedBytes != 120 {
		t.Errorf("overview queued bytes %d, want 120", ov.QueuedBytes)
	}
}

// TestMetricsAndHealth: /metrics shows the broker's figures, /readyz its
// readiness; both stay open when a token guards the rest, as /healthz does.
func TestMetricsAndHealth(t *testing.T) {
	f := newFakeBroker()
	f.figures = Figures{ClientsConnected: 3, Sessions: 5, MessagesReceived: 42, ConnWrites: 7, GroupResultsDropped: 2,
		LogCommits: 4, LogResolveCommits: 1, LogWriteTime: 1500 * time.Millisecond, PollerRescues: 3, PollerEvents: 11}
	f.groups.add("w/a", 2, 1, nil, 0)
	_, base := serve(t, f, Config{Token: "s3cret"})
	code, body := call(t, "GET", base+"/metrics")
	for _, want := range []string{"keyline_clients_connected 3", "keyline_clients_disconnected 2", "keyline_messages_received_total 42",
		"keyline_conn_writes_total 7", "keyline_ready 1", "keyline_keyshared_results_dropped_total 2", `keyline_group_backlog{group="w/a"} 1`,
		"keyline_group_log_commits_total 4", "keyline_group_log_resolve_commits_total 1", "keyline_group_log_write_seconds_total 1.5",
		"keyline_poller_rescues_total 3", "keyline_poller_events_total 11"} {
		if code != 200 || !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics (%d) lacks %q", code, want)
		}
	}
	if code, _ := call(t, "GET", base+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d", code)
	}
	f.mu.Lock()
	f.ready = false
	f.mu.Unlock()
	if code, _ := call(t, "GET", base+"/readyz"); code != 503 {
		t.Errorf("/readyz not ready = %d", code)
	}
	if code, _ := call(t, "GET", base+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	if code, body := call(t, "GET", base+adminapi.PathGroups); code != 401 || !strings.Contains(body, "missing bearer token") {
		t.Errorf("without the token: %d %s", code, body)
	}
	if code, _ := call(t, "GET", base+adminapi.PathGroups, "Authorization", "Bearer s3cret"); code != 200 {
		t.Errorf("with the token: %d", code)
	}
	if code, body := call(t, "GET", base+adminapi.PathGroups, "Authorization", "Bearer s3cret", "Host", "evil.example"); code != 403 || !strings.Contains(body, "http-allowed-hosts") {
		t.Errorf("another Host: %d %s", code, body)
	}
}

// TestGroupRatesAtTheFirstLook: the observer samples every group's counters,
// so the groups list has rates before anyone looked twice.
func TestGroupRatesAtTheFirstLook(t *testing.T) {
	f := newFakeBroker()
	f.groups.add("rates/x/#", 0, 0, []string{"m1"}, 0)
	s, base := serve(t, f, Config{})
	// What the observer does every few seconds (the first time 5 s after the
	// start), as if it had done so 2 s ago.
	s.obs.groupRates(time.Now().Add(-2 * time.Second))
	var gl adminapi.GroupList
	callJSON(t, "GET", base+adminapi.PathGroups, 200, &gl)
	if len(gl.Groups) != 1 || gl.Groups[0].Rates == nil || gl.Groups[0].Rates.WindowSeconds < 1.5 {
		t.Errorf("at the first look: %+v", gl.Groups)
	}
}
