package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// fakeBackend serves canned views and records actions.
type fakeBackend struct {
	groups  []adminapi.GroupView
	letters map[string][]adminapi.DeadLetterView
	clients []adminapi.ClientDetail
	bridges []adminapi.BridgeView

	mu      sync.Mutex
	actions []string
}

func (f *fakeBackend) record(format string, a ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actions = append(f.actions, fmt.Sprintf(format, a...))
}

func (f *fakeBackend) Overview() adminapi.OverviewView {
	h := []adminapi.OverviewSample{{MessagesIn: 5, MessagesOut: 10}, {MessagesIn: 7, MessagesOut: 3, ClientsConnected: 2}}
	return adminapi.OverviewView{ClientsConnected: 2, MessagesReceived: 1234567, DataFile: "/data/<keyline>.db", Groups: len(f.groups),
		Rates: &h[1], History: h, SampleSeconds: 1}
}

func (f *fakeBackend) Groups() ([]adminapi.GroupView, error) { return f.groups, nil }

func (f *fakeBackend) Group(name string) (adminapi.GroupView, error) {
	for _, g := range f.groups {
		if g.Name == name {
			return g, nil
		}
	}
	return adminapi.GroupView{}, &adminapi.StatusError{Status: 404, Message: fmt.Sprintf("no group %q", name)}
}

func (f *fakeBackend) GroupMessages(ctx context.Context, name string, limit int) (adminapi.GroupMessagesView, error) {
	if _, err := f.Group(name); err != nil {
		return adminapi.GroupMessagesView{}, err
	}
	return adminapi.GroupMessagesView{Group: name, Messages: []adminapi.PendingMessageView{
		{Offset: 7, Key: "<k>", Topic: "t/<b>", Payload: "<img src=x onerror=alert(1)>", PayloadEncoding: "utf-8", PayloadSize: 28, State: adminapi.MessageInFlight, InFlightTo: "w<1>"},
	}}, nil
}

func (f *fakeBackend) GroupActivity(name string) (adminapi.GroupActivityView, error) {
	return adminapi.GroupActivityView{Group: name, History: []adminapi.GroupSample{{Delivered: 4, Acked: 2}, {Delivered: 8, Acked: 8}}}, nil
}

func (f *fakeBackend) DeleteGroup(_ context.Context, name, remote string) (adminapi.DeleteGroupResult, error) {
	f.record("delete %s from %s", name, remote)
	return adminapi.DeleteGroupResult{Deleted: name}, nil
}

func (f *fakeBackend) DeadLetters(name string, after uint64, limit int) (adminapi.DeadLetterPage, error) {
	all, ok := f.letters[name]
	if !ok {
		return adminapi.DeadLetterPage{}, &adminapi.StatusError{Status: 404, Message: fmt.Sprintf("no group %q", name)}
	}
	p := adminapi.DeadLetterPage{Group: name, Total: uint64(len(all)), DeadLetters: []adminapi.DeadLetterView{}}
	for _, l := range all {
		if l.ID <= after {
			continue
		}
		if len(p.DeadLetters) == limit {
			p.More, p.NextAfter = true, p.DeadLetters[limit-1].ID
			break
		}
		p.DeadLetters = append(p.DeadLetters, l)
	}
	return p, nil
}

func (f *fakeBackend) DeadLetter(name string, id uint64) (adminapi.DeadLetterView, error) {
	all, ok := f.letters[name]
	if !ok {
		return adminapi.DeadLetterView{}, &adminapi.StatusError{Status: 404, Message: fmt.Sprintf("no group %q", name)}
	}
	for _, l := range all {
		if l.ID == id {
			return l, nil
		}
	}
	return adminapi.DeadLetterView{}, &adminapi.StatusError{Status: 404, Message: fmt.Sprintf("group %q has no dead letter with id %d", name, id)}
}

func (f *fakeBackend) Replay(_ context.Context, name string, id uint64, all bool, remote string) (adminapi.ReplayResult, error) {
	f.record("replay %s %d %v from %s", name, id, all, remote)
	return adminapi.ReplayResult{Group: name, Count: 1, Replayed: []adminapi.ReplayedLetter{{ID: id, Offset: 99, Key: "<k>", Topic: "t"}}}, nil
}

func (f *fakeBackend) Purge(name string, id uint64, all bool, remote string) (adminapi.PurgeResult, error) {
	f.record("purge %s %d %v from %s", name, id, all, remote)
	return adminapi.PurgeResult{Group: name, Purged: 3}, nil
}

func (f *fakeBackend) Clients() []adminapi.ClientView {
	var out []adminapi.ClientView
	for _, c := range f.clients {
		out = append(out, c.ClientView)
	}
	return out
}

func (f *fakeBackend) Client(id string) (adminapi.ClientDetail, error) {
	for _, c := range f.clients {
		if c.ID == id {
			return c, nil
		}
	}
	return adminapi.ClientDetail{}, &adminapi.StatusError{Status: 404, Message: fmt.Sprintf("no client with id %q", id)}
}

func (f *fakeBackend) Bridges() []adminapi.BridgeView { return f.bridges }

func (f *fakeBackend) Disconnect(id, remote string) (adminapi.DisconnectResult, error) {
	f.record("disconnect %s from %s", id, remote)
	return adminapi.DisconnectResult{Disconnected: id, SessionKept: true}, nil
}

// evil is a group name with markup in it (a share name may hold '<', '"', '&').
const evil = `<script>alert("g")</script>/a/#`

func newFake() *fakeBackend {
	f := &fakeBackend{letters: map[string][]adminapi.DeadLetterView{}}
	for i := range 250 {
		f.groups = append(f.groups, adminapi.GroupView{Name: fmt.Sprintf("g%03d/t/#", i), Backlog: uint64(i)})
	}
	f.groups = append(f.groups, adminapi.GroupView{Name: evil, DeadLetters: 2, Members: []string{}})
	f.letters[evil] = []adminapi.DeadLetterView{
		{ID: 1, Key: `<b>key</b>`, Topic: "a/<i>", Payload: "<script>alert(1)</script>", PayloadEncoding: "utf-8", PayloadSize: 25, Reason: "0x87 not authorized"},
		{ID: 2, Key: "bin", Topic: "a/b", Payload: "//4AAQ==", PayloadEncoding: "base64", PayloadSize: 4},
	}
	f.clients = []adminapi.ClientDetail{
		{ClientView: adminapi.ClientView{ID: `dev"<1>`, Connected: true, ProtocolVersion: 4, Remote: "127.0.0.1:5", QueuedBytes: 2 << 20, QueueSoft: 1 << 20, QueueHard: 8 << 20},
			SubscriptionList: []adminapi.SubscriptionView{{Filter: "x/<y>/#", QoS: 1}}},
		{ClientView: adminapi.ClientView{ID: "calm", Connected: true, ProtocolVersion: 5}},
	}
	f.bridges = []adminapi.BridgeView{{Name: "cloud", State: "connected", Address: "central:8883", ClientID: `<i>site</i>`, Protocol: "5",
		Topics: []string{`sensors/<y>/# out 1 "" site/`}, Groups: []string{"$keyline.bridge.cloud/sensors/#"}, QueuedMessages: 4321,
		LastError: "<b>key</b> refused"}}
	return f
}

func serve(t *testing.T, f *fakeBackend, token string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	New(f, Options{Auth: NewAuth(token)}).Register(mux)
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func get(t *testing.T, u string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

var (
	// inlineScript finds what a strict CSP would block: inline scripts, event
	// handler and style attributes, javascript: URLs.
	inlineScript = regexp.MustCompile(`(?i)<script(?:\s[^>]*)?>[^<]|<script>|<[a-z][^>]*\s(?:on[a-z]+|style)=|javascript:`)
	rawMarkup    = regexp.MustCompile(`<script>alert|<b>key|<img src=x|<i>|<y>`)
)

func TestEveryPageRendersSafely(t *testing.T) {
	s := serve(t, newFake(), "")
	g := url.QueryEscape(evil)
	for _, p := range []string{
		"/", "/groups", "/groups?page=3", "/groups?q=g00&sort=backlog", "/groups/view?group=" + g,
		"/dlq", "/dlq?group=" + g, "/dlq/letter?group=" + g + "&id=1", "/dlq/letter?group=" + g + "&id=2",
		"/clients", "/clients?q=dev&slow=1", "/clients/view?id=" + url.QueryEscape(`dev"<1>`), "/topics", "/topics?filter=" + url.QueryEscape("a/<b>/#"), "/bridges",
		"/confirm?action=replay&all=1&group=" + g, "/confirm?action=purge&id=1&group=" + g,
		"/confirm?action=delete-group&group=" + g, "/confirm?action=disconnect&client=" + url.QueryEscape(`dev"<1>`), "/login",
	} {
		resp, body := get(t, s.URL+p)
		if resp.StatusCode != 200 {
			t.Errorf("GET %s = %d: %s", p, resp.StatusCode, body)
			continue
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q", p, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("Cache-Control") != "no-store" {
			t.Errorf("GET %s: headers %v", p, resp.Header)
		}
		if m := inlineScript.FindString(body); m != "" {
			t.Errorf("GET %s: inline code %q", p, m)
		}
		if m := rawMarkup.FindString(body); m != "" {
			t.Errorf("GET %s: client-controlled markup reached the page unescaped: %q", p, m)
		}
	}
}

func TestPagesShowWhatTheBackendHolds(t *testing.T) {
	s := serve(t, newFake(), "")
	_, body := get(t, s.URL+"/")
	if !strings.Contains(body, "1,234,567") {
		t.Error("overview lacks messages received 1,234,567")
	}
	if !strings.Contains(body, `points="299,2.0 300,41.2"`) {
		t.Errorf("overview chart points not drawn from the history:\n%s", body)
	}
	_, body = get(t, s.URL+"/groups?page=2")
	if n := strings.Count(body, "<tr data-group="); n != groupsPerPage {
		t.Errorf("groups page 2 lists %d rows, want %d", n, groupsPerPage)
	}
	// Sorted by name the evil group comes first: page 2 holds g099-g198.
	if !strings.Contains(body, "g099/t/#") || !strings.Contains(body, "g198/t/#") || strings.Contains(body, "g098/t/#") ||
		strings.Contains(body, "g199/t/#") || !strings.Contains(body, "page 2 of 3") {
		t.Error("groups page 2 does not hold rows 101-200")
	}
	_, body = get(t, s.URL+"/groups?sort=backlog")
	if i, j := strings.Index(body, "g249/t/#"), strings.Index(body, "g248/t/#"); i < 0 || j < 0 || i > j {
		t.Error("sorting by backlog does not put g249 first")
	}
	_, body = get(t, s.URL+"/dlq/letter?group="+url.QueryEscape(evil)+"&id=2")
	if !strings.Contains(body, "00000000  ff fe 00 01") {
		t.Errorf("binary payload not shown as hex:\n%s", body)
	}
	_, body = get(t, s.URL+"/bridges")
	if !strings.Contains(body, "4,321") || !strings.Contains(body, `data-poll="/api/v1/bridges/cloud"`) || !strings.Contains(body, "%24keyline.bridge.cloud%2Fsensors%2F%23") {
		t.Errorf("bridges page lacks the queue, the live view or the dead letters' link:\n%s", body)
	}
	_, body = get(t, s.URL+"/clients?slow=1")
	if !strings.Contains(body, "slow: queue over its soft limit") || strings.Contains(body, `data-client="calm"`) {
		t.Error("the slow filter does not keep exactly the slow client")
	}
	for p, want := range map[string]int{
		"/groups/view?group=nope/x": 404, "/groups/view": 400, "/groups?sort=size": 400, "/dlq?group=" + url.QueryEscape(evil) + "&after=x": 400,
		"/clients/view?id=ghost": 404, "/confirm?action=explode": 400, "/nowhere": 404, "/groups?page=0": 400,
	} {
		if resp, body := get(t, s.URL+p); resp.StatusCode != want || !strings.Contains(body, `class="error"`) {
			t.Errorf("GET %s = %d, want %d with an error message", p, resp.StatusCode, want)
		}
	}
}

// TestClusterNodesAreShown: in cluster mode the group page names the node
// dispatching the group and each member's node, the clients list each
// client's node; on one node neither column is there.
func TestClusterNodesAreShown(t *testing.T) {
	f := newFake()
	s := serve(t, f, "")
	_, body := get(t, s.URL+"/clients")
	if strings.Contains(body, "<th>node</th>") {
		t.Error("single node: the clients list has a node column")
	}
	f.groups = append(f.groups, adminapi.GroupView{Name: "spread/t/#", Running: true, Holder: "node-b",
		Members: []string{"w1"}, PerMember: []adminapi.MemberView{{ID: "w1", Connected: true, Node: "node-c"}}})
	f.clients[1].Node = "node-a"
	_, body = get(t, s.URL+"/groups/view?group="+url.QueryEscape("spread/t/#"))
	if !strings.Contains(body, `id="group-holder">node-b<`) || !strings.Contains(body, `<td class="mono">node-c</td>`) {
		t.Errorf("group page lacks the holder node-b or the member's node-c:\n%s", body)
	}
	_, body = get(t, s.URL+"/clients")
	if !strings.Contains(body, "<th>node</th>") || !strings.Contains(body, `<td class="mono">node-a</td>`) {
		t.Error("cluster mode: the clients list lacks the node column")
	}
}

func TestActionsPostAndReport(t *testing.T) {
	f := newFake()
	s := serve(t, f, "")
	post := func(path string, form url.Values) (int, string) {
		resp, err := http.PostForm(s.URL+path, form)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := post("/actions/replay", url.Values{"group": {evil}, "id": {"1"}})
	if code != 200 || !strings.Contains(body, "Replayed 1 dead letter of group") || !strings.Contains(body, "<td class=\"n\">99</td>") {
		t.Errorf("replay: %d %s", code, body)
	}
	if code, body = post("/actions/purge", url.Values{"group": {evil}, "all": {"1"}}); code != 200 || !strings.Contains(body, "Purged 3 dead letters") {
		t.Errorf("purge: %d %s", code, body)
	}
	if code, body = post("/actions/disconnect", url.Values{"client": {"calm"}}); code != 200 || !strings.Contains(body, "its persistent session stays") {
		t.Errorf("disconnect: %d %s", code, body)
	}
	if code, _ = post("/actions/replay", url.Values{"group": {evil}}); code != 400 {
		t.Errorf("replay without id or all = %d, want 400", code)
	}
	if resp, _ := get(t, s.URL+"/actions/replay?group=a/b&id=1"); resp.StatusCode != 404 {
		t.Errorf("GET of an action = %d, want 404 (actions are POST only)", resp.StatusCode)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := []string{"replay " + evil + " 1 false from 127.0.0.1", "purge " + evil + " 0 true from 127.0.0.1", "disconnect calm from 127.0.0.1"}
	if len(f.actions) != len(want) {
		t.Fatalf("actions %q, want %q", f.actions, want)
	}
	for i := range want {
		if !strings.HasPrefix(f.actions[i], want[i]) {
			t.Errorf("action %d = %q, want %q...", i, f.actions[i], want[i])
		}
	}
}

func TestLoginSetsAStrictCookie(t *testing.T) {
	s := serve(t, newFake(), "s3cret")
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(form url.Values) *http.Response {
		resp, err := client.PostForm(s.URL+"/login", form)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	if resp := post(url.Values{"token": {"wrong"}, "next": {"/groups"}}); resp.StatusCode != 401 || len(resp.Cookies()) != 0 {
		t.Errorf("wrong token: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	resp := post(url.Values{"token": {"s3cret"}, "next": {"/groups?q=a"}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/groups?q=a" {
		t.Fatalf("login: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	cs := resp.Cookies()
	if len(cs) != 1 || cs[0].Name != adminapi.SessionCookie || len(cs[0].Value) < 40 || cs[0].MaxAge != int(SessionTTL/time.Second) ||
		!cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode || cs[0].Path != "/" {
		t.Fatalf("cookie %+v", cs)
	}
	if again := post(url.Values{"token": {"s3cret"}}).Cookies(); len(again) != 1 || again[0].Value == cs[0].Value || strings.Contains(cs[0].Value, "s3cret") {
		t.Error("the cookie carries the token, or is the same for every login")
	}
	for next, want := range map[string]string{"//evil.example/x": "/", "https://evil.example": "/", "/\\evil": "/", "/login": "/", "": "/", "/dlq?group=a%2Fb": "/dlq?group=a%2Fb"} {
		if got := post(url.Values{"token": {"s3cret"}, "next": {next}}).Header.Get("Location"); got != want {
			t.Errorf("next=%q redirects to %q, want %q", next, got, want)
		}
	}
}

func TestFormats(t *testing.T) {
	for v, want := range map[any]string{0: "0", 999: "999", 1000: "1,000", int64(-1234567): "-1,234,567", uint64(10000): "10,000", 12.6: "13"} {
		if got := num(v); got != want {
			t.Errorf("num(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[any]string{0: "0 B", 1023: "1,023 B", 1536: "1.5 KiB", int64(5 << 30): "5.0 GiB"} {
		if got := byteSize(v); got != want {
			t.Errorf("byteSize(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]string{0: "0.0", 9.94: "9.9", 12.5: "13", 123456: "123,456"} {
		if got := rate(v); got != want {
			t.Errorf("rate(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]string{5: "5s", 65: "1m 5s", 3700: "1h 1m", 90000: "1d 1h"} {
		if got := duration(v); got != want {
			t.Errorf("duration(%v) = %q, want %q", v, got, want)
		}
	}
	if got := preview("a\nb   c", "utf-8", 10); got != "a b c" {
		t.Errorf("preview of text = %q", got)
	}
	if got := preview("AAECAwQFBgcICQoL", "base64", 12); got != "hex 00 01 02 03 …" {
		t.Errorf("preview of binary = %q", got)
	}
	if got := preview("bell\x07", "utf-8", 20); got != "hex 62 65 6c 6c 07" {
		t.Errorf("preview of text with a control character = %q", got)
	}
	if p := decodePayload("!!", "base64"); !p.Malformed {
		t.Error("bad base64 not reported")
	}
	if c := newChart("c", "t", "u", "rate", []series{{Key: "a"}}, map[string][]float64{"a": {0, 2, 4}}); c.Series[0].Points != "298,58.0 299,30.0 300,2.0" || c.Max != 4 {
		t.Errorf("chart = %+v", c)
	}
}

func TestStaticAssets(t *testing.T) {
	s := serve(t, newFake(), "")
	for p, ctype := range map[string]string{"/static/console.js": "text/javascript", "/static/console.css": "text/css", "/static/favicon.svg": "image/svg+xml"} {
		resp, body := get(t, s.URL+p)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), ctype) || len(body) == 0 {
			t.Errorf("GET %s = %d %q", p, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	if resp, _ := get(t, s.URL+"/static/"); resp.StatusCode != 404 {
		t.Errorf("GET /static/ = %d, want 404 (no listing)", resp.StatusCode)
	}
	for _, p := range []string{"/login", "/logout", "/static/console.js", "/favicon.ico"} {
		if !Public(p) {
			t.Errorf("%s is not public", p)
		}
	}
	for _, p := range []string{"/", "/groups", "/api/v1/groups", "/loginx", "/staticx"} {
		if Public(p) {
			t.Errorf("%s is public", p)
		}
	}
}

// TestWrongTokensAreSpaced: every token check passes one gate, and a wrong
// one holds it GuessSpacing: 100 concurrent guesses take 100 spacings, from
// any mix of addresses, while the right token, sent among them, is let in
// after the guesses queued ahead of it (never refused: the per-address
// lockout of before refused it).
func TestWrongTokensAreSpaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := NewAuth("s3cret")
		check := func(token string) bool {
			ok, err := a.Check(httptest.NewRequest("POST", "/login", nil), token)
			if err != nil {
				t.Error(err)
			}
			return ok
		}
		start := time.Now()
		var wg sync.WaitGroup
		var wrong atomic.Int64
		for i := range 100 {
			wg.Go(func() {
				if check(fmt.Sprintf("guess-%d", i)) {
					t.Error("a guess was taken")
				}
				wrong.Add(1)
			})
		}
		synctest.Wait() // every guess is at the gate (one in it)
		if !check("s3cret") {
			t.Fatal("the right token was refused")
		}
		waited := time.Since(start)
		wg.Wait()
		if took := time.Since(start); took < 100*GuessSpacing || waited > took {
			t.Fatalf("100 wrong guesses answered in %v (want at least %v); the right token waited %v", took, 100*GuessSpacing, waited)
		}
		if wrong.Load() != 100 {
			t.Fatalf("%d wrong guesses answered", wrong.Load())
		}
	})
}

// TestSessionsExpireAndAreBounded: a session ends after SessionTTL, and at
// most maxSessions live at once (the oldest goes first).
func TestSessionsExpireAndAreBounded(t *testing.T) {
	a := NewAuth("s3cret")
	now := time.Unix(1_800_000_000, 0)
	a.now = func() time.Time { return now }
	start := func() *http.Cookie {
		w := httptest.NewRecorder()
		a.startSession(w, httptest.NewRequest("POST", "/login", nil))
		return w.Result().Cookies()[0]
	}
	valid := func(c *http.Cookie) bool {
		r := httptest.NewRequest("GET", "/", nil)
		r.AddCookie(c)
		return a.Session(r)
	}
	first := start()
	if !valid(first) || first.MaxAge != int(SessionTTL/time.Second) || !first.Expires.Equal(now.Add(SessionTTL).Truncate(time.Second)) {
		t.Fatalf("new session: valid %v, cookie %+v", valid(first), first)
	}
	now = now.Add(SessionTTL)
	if valid(first) {
		t.Fatal("a session outlived SessionTTL")
	}
	kept := start()
	for range maxSessions + 10 {
		now = now.Add(time.Millisecond)
		start()
	}
	if n := len(a.mu.sessions); n > maxSessions {
		t.Fatalf("%d sessions kept, bound %d", n, maxSessions)
	}
	if valid(kept) {
		t.Fatal("the oldest session outlived the bound")
	}
}
