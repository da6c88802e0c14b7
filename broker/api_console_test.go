package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/broker/ops"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

func TestOverviewAPI(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr, base := b.Addr("tcp"), "http://"+b.Addr("http")
	connectMember(t, addr, "m1", "$share/ov/jobs/#")
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	for i := range 10 {
		if rc := pub.Publish(t, keyed("jobs/a", fmt.Sprint(i), []byte("x"))); rc != 0 {
			t.Fatalf("publish: %#x", rc)
		}
	}
	var o adminapi.OverviewView
	eventually(t, "two samples in the overview's history", func() bool {
		apiJSON(t, "GET", base+adminapi.PathOverview, "", 200, &o)
		return len(o.History) >= 2 && o.Rates != nil
	})
	if o.ClientsConnected != 2 || o.MessagesReceived < 10 || o.Groups != 1 || o.DataFileBytes <= 0 || o.UptimeSeconds <= 0 ||
		o.SampleSeconds != 1 || !strings.HasSuffix(o.DataFile, "keyline.db") || o.Subscriptions < 1 {
		t.Errorf("overview %+v", o)
	}
	var in float64
	for _, s := range o.History {
		in += s.MessagesIn * o.SampleSeconds
	}
	if math.Round(in) < 10 { // the intervals are about SampleSeconds long

		t.Errorf("the history accounts for %.0f messages in, want at least 10: %+v", in, o.History)
	}
	apiErr(t, "GET", base+adminapi.PathOverview+"?x=1", "", 400, `unknown query parameter "x"`)
}

// TestGroupMessagesShowTheBacklog: a member that never acks holds one
// message per key; the oldest messages after the cursor say which.
func TestGroupMessagesShowTheBacklog(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr, base := b.Addr("tcp"), "http://"+b.Addr("http")
	const name = "om/jobs/#"
	_, got := connectSilentMember(t, addr, "silent", "$share/om/jobs/#")
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	for _, m := range []*paho.Publish{keyed("jobs/a", "k1", []byte("one")), keyed("jobs/a", "k1", []byte("two")), keyed("jobs/b", "k2", []byte{0xff, 0})} {
		if rc := pub.Publish(t, m); rc != 0 {
			t.Fatalf("publish: %#x", rc)
		}
	}
	for range 2 { // k1's first and k2's: k1's second waits behind its first
		select {
		case <-got:
		case <-time.After(mqtttest.Timeout):
			t.Fatal("the member did not receive its two messages")
		}
	}
	// The dispatcher marked both in flight before their packets went out, and
	// it answers the states itself, so one look suffices.
	var v adminapi.GroupMessagesView
	apiJSON(t, "GET", base+adminapi.PathGroupMessages+groupQuery(name), "", 200, &v)
	m := v.Messages
	if len(m) != 3 {
		t.Fatalf("messages %+v", v)
	}
	if v.Cursor != 0 || v.Head != 3 || v.More ||
		m[0].Offset != 1 || m[0].Key != "k1" || m[0].Payload != "one" || m[0].InFlightTo != "silent" || m[0].State != adminapi.MessageInFlight ||
		m[1].Offset != 2 || m[1].InFlightTo != "" || m[1].State != adminapi.MessageWaiting ||
		m[2].Key != "k2" || m[2].PayloadEncoding != "base64" || m[2].Payload != "/wA=" || m[2].PayloadSize != 2 || m[2].InFlightTo != "silent" || m[2].State != adminapi.MessageInFlight {
		t.Errorf("messages %+v", v)
	}
	apiJSON(t, "GET", base+adminapi.PathGroupMessages+groupQuery(name, "limit", "1"), "", 200, &v)
	if len(v.Messages) != 1 || !v.More {
		t.Errorf("limit 1: %+v", v)
	}
	apiErr(t, "GET", base+adminapi.PathGroupMessages+groupQuery(name, "limit", "201"), "", 400, `"limit"`)
	apiErr(t, "GET", base+adminapi.PathGroupMessages+"?group=no/such", "", 404, `no group "no/such"`)

	var act adminapi.GroupActivityView
	eventually(t, "the group's activity sampled", func() bool {
		apiJSON(t, "GET", base+adminapi.PathGroupActivity+groupQuery(name), "", 200, &act)
		return len(act.History) >= 2
	})
	if last := act.History[len(act.History)-1]; act.Group != name || last.InFlight != 2 || last.Backlog != 3 {
		t.Errorf("activity %+v", act)
	}
	apiErr(t, "GET", base+adminapi.PathGroupActivity+"?group=no/such", "", 404, "no group")
}

func TestClientDetailAndDisconnect(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr, base := b.Addr("tcp"), "http://"+b.Addr("http")
	w, err := mqtttest.DialWorker(addr, "dev-1", mqtttest.WorkerOptions{SessionExpiry: 300, KeepAlive: 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	for _, f := range []string{"b/#", "a/+"} {
		if rc, err := w.Subscribe(f, 1); err != nil || rc != 1 {
			t.Fatalf("subscribe %s: %#x %v", f, rc, err)
		}
	}
	var d adminapi.ClientDetail
	apiJSON(t, "GET", base+"/api/v1/clients/dev-1", "", 200, &d)
	if d.ID != "dev-1" || !d.Connected || d.ProtocolVersion != 5 || len(d.SubscriptionList) != 2 ||
		d.SubscriptionList[0].Filter != "a/+" || d.SubscriptionList[1].QoS != 1 || d.KeepAlive != 30 || d.Clean {
		t.Errorf("detail %+v", d)
	}

	var res adminapi.DisconnectResult
	apiJSON(t, "POST", base+"/api/v1/clients/dev-1/disconnect", "", 200, &res)
	if res.Disconnected != "dev-1" || !res.SessionKept {
		t.Errorf("disconnect %+v", res)
	}
	select {
	case <-w.Done():
	case <-time.After(mqtttest.Timeout):
		t.Fatal("the client is still connected")
	}
	var de *mqtttest.DisconnectError
	if err := w.Err(); !errors.As(err, &de) || de.ReasonCode != 0x98 {
		t.Errorf("the client saw %v, want DISCONNECT 0x98", err)
	}
	eventually(t, "the session kept, disconnected", func() bool {
		apiJSON(t, "GET", base+"/api/v1/clients/dev-1", "", 200, &d)
		return !d.Connected
	})
	apiErr(t, "POST", base+"/api/v1/clients/dev-1/disconnect", "", 409, "is not connected")
	apiErr(t, "POST", base+"/api/v1/clients/ghost/disconnect", "", 404, `no client with id "ghost"`)
	apiErr(t, "GET", base+"/api/v1/clients/ghost", "", 404, `no client with id "ghost"`)
	apiErr(t, "GET", base+"/api/v1/clients/dev-1/disconnect", "", 405, "allowed: POST")
}

// sseEvent is one server-sent event.
type sseEvent = mqtttest.SSE

// openStream opens a topic stream and returns its events; it ends with the test.
func openStream(t *testing.T, base, filter string) (<-chan sseEvent, *http.Response) {
	t.Helper()
	resp, events := mqtttest.OpenSSE(t, http.DefaultClient, base+adminapi.PathTopicStream+"?"+url.Values{"filter": {filter}}.Encode(), 1000)
	return events, resp
}

func nextMessage(t *testing.T, events <-chan sseEvent) adminapi.TopicEvent {
	t.Helper()
	timeout := time.After(mqtttest.Timeout)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the stream ended")
			}
			if ev.Name != "message" {
				continue
			}
			var m adminapi.TopicEvent
			if err := json.Unmarshal([]byte(ev.Data), &m); err != nil {
				t.Fatalf("event data %q: %v", ev.Data, err)
			}
			return m
		case <-timeout:
			t.Fatal("no message on the stream")
		}
	}
}

func TestTopicStream(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr, base := b.Addr("tcp"), "http://"+b.Addr("http")
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: "s/retained", QoS: 1, Retain: true, Payload: []byte("kept")})
	// mochi acknowledges a QoS 1 publish before it has routed it (and told
	// the stream): the acknowledgement of the next one means it has.
	pub.Publish(t, &paho.Publish{Topic: "other/barrier", QoS: 1, Payload: []byte("b")})

	events, resp := openStream(t, base, "s/#")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if m := nextMessage(t, events); m.Topic != "s/retained" || m.Payload != "kept" || !m.Retain {
		t.Errorf("first event %+v, want the retained message", m)
	}
	// QoS 0 and QoS 1 publishes both take the fan-out's fast path: the stream sees them.
	pub.Publish(t, &paho.Publish{Topic: "other/x", QoS: 0, Payload: []byte("not shown")})
	pub.Publish(t, &paho.Publish{Topic: "s/a", QoS: 0, Payload: []byte(`</script><b>"hi"`)})
	pub.Publish(t, &paho.Publish{Topic: "s/b", QoS: 1, Payload: []byte{0xff, 1, 2}})
	if m := nextMessage(t, events); m.Topic != "s/a" || m.Payload != `</script><b>"hi"` || m.Retain {
		t.Errorf("event %+v", m)
	}
	if m := nextMessage(t, events); m.Topic != "s/b" || m.PayloadEncoding != "base64" || m.Payload != "/wEC" || m.QoS != 1 {
		t.Errorf("event %+v", m)
	}
	code, body := httpGet(t, base+adminapi.PathTopicStream+"?filter=%24share%2Fg%2Fs%2F%23")
	if code != 400 || !strings.Contains(body, "shared subscription") {
		t.Errorf("a shared filter: %d %s", code, body)
	}
	if code, body := httpGet(t, base+adminapi.PathTopicStream); code != 400 || !strings.Contains(body, `missing query parameter \"filter\"`) {
		t.Errorf("no filter: %d %s", code, body)
	}
	for range ops.MaxTopicViewers - 1 {
		openStream(t, base, "s/#")
	}
	// One stream more takes the place of the oldest, which is told so.
	if _, resp := openStream(t, base, "s"); resp.StatusCode != 200 {
		t.Errorf("one stream more: %d", resp.StatusCode)
	}
	for ev := range events {
		if ev.Name == "closed" {
			if !strings.Contains(ev.Data, "took this one's place") {
				t.Errorf("closed event %q", ev.Data)
			}
			return
		}
	}
	t.Error("the oldest stream ended without a closed event")
}

// TestStreamEscapesMarkup: SSE data is JSON with <, > and & escaped, so a
// payload can never become markup, whatever reads the stream.
func TestStreamEscapesMarkup(t *testing.T) {
	b := startBroker(t, testConfig(t))
	base := "http://" + b.Addr("http")
	events, _ := openStream(t, base, "x")
	b.ops.Published("x", 0, false, []byte("<img src=x onerror=alert(1)>&"))
	for ev := range events {
		if ev.Name == "message" {
			if strings.ContainsAny(ev.Data, "<>&") || !strings.Contains(ev.Data, `\u003cimg`) {
				t.Errorf("event data %q", ev.Data)
			}
			return
		}
	}
}

// TestConsoleNeedsTheTokenOrItsCookie: with a token set, pages send a
// browser to the login page, the API answers 401, and the session cookie
// the login sets opens both; a cross-origin POST fails even with it.
func TestConsoleNeedsTheTokenOrItsCookie(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPToken = "s3cret"
	b := startBroker(t, cfg)
	base := "http://" + b.Addr("http")
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string, header ...string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, p := range []string{"/", "/groups?q=a", "/dlq", "/clients", "/topics"} {
		resp := do("GET", p)
		if want := "/login?next=" + url.QueryEscape(p); resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
			t.Errorf("GET %s without a token: %d to %q, want 303 to %q", p, resp.StatusCode, resp.Header.Get("Location"), want)
		}
	}
	for _, p := range []string{"/login", "/static/console.js", "/static/console.css", "/healthz"} {
		if resp := do("GET", p); resp.StatusCode != 200 {
			t.Errorf("GET %s without a token = %d, want 200", p, resp.StatusCode)
		}
	}
	apiErr(t, "GET", base+adminapi.PathOverview, "", 401, "missing bearer token")
	apiErr(t, "POST", base+"/api/v1/clients/x/disconnect", "", 401, "missing bearer token")
	if resp := do("POST", "/actions/purge?group=a/b&all=1"); resp.StatusCode != 401 {
		t.Errorf("POST an action without a token = %d, want 401", resp.StatusCode)
	}
	cookie := loginCookie(t, base, "s3cret")
	for _, p := range []string{"/", "/groups", adminapi.PathOverview, "/api/v1/groups"} {
		if resp := do("GET", p, "Cookie", cookie); resp.StatusCode != 200 {
			t.Errorf("GET %s with the session cookie = %d, want 200", p, resp.StatusCode)
		}
		if resp := do("GET", p, "Cookie", adminapi.SessionCookie+"=guess"); resp.StatusCode == 200 {
			t.Errorf("GET %s with a wrong cookie = 200", p)
		}
	}
	if resp := do("POST", "/api/v1/clients/ghost/disconnect", "Cookie", cookie); resp.StatusCode != 404 {
		t.Errorf("POST with the cookie = %d, want 404 (authorized, no such client)", resp.StatusCode)
	}
	if resp := do("POST", "/api/v1/clients/ghost/disconnect", "Cookie", cookie, "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"); resp.StatusCode != 403 {
		t.Errorf("cross-origin POST with the cookie = %d, want 403", resp.StatusCode)
	}
	if resp := do("POST", "/login", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"); resp.StatusCode != 403 {
		t.Errorf("cross-origin login = %d, want 403", resp.StatusCode)
	}
}

// loginCookie logs in to the console at base with token and returns the
// session cookie, as a Cookie header's value.
func loginCookie(t *testing.T, base, token string) string {
	t.Helper()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.PostForm(base+"/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == adminapi.SessionCookie && c.Value != "" {
			return c.Name + "=" + c.Value
		}
	}
	t.Fatalf("login: %s, no session cookie", resp.Status)
	return ""
}
