package broker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/poll"
)

// apiCall sends method url with an optional bearer token and returns the
// status and body; a JSON error answer must have the JSON content type.
func apiCall(t *testing.T, method, u, token string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	if strings.HasPrefix(resp.Request.URL.Path, "/api/") && resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, u, resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, body
}

// apiJSON calls the API, wants status want and decodes the body into out.
func apiJSON(t *testing.T, method, u, token string, want int, out any) {
	t.Helper()
	code, body := apiCall(t, method, u, token)
	if code != want {
		t.Fatalf("%s %s = %d %s, want %d", method, u, code, body, want)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, u, err, body)
		}
	}
}

// apiErr calls the API and wants status want with a JSON error containing substr.
func apiErr(t *testing.T, method, u, token string, want int, substr string) {
	t.Helper()
	var e adminapi.Error
	apiJSON(t, method, u, token, want, &e)
	if e.Error == "" || !strings.Contains(e.Error, substr) {
		t.Errorf("%s %s: error %q, want one containing %q", method, u, e.Error, substr)
	}
}

// eventually polls cond until it holds or mqtttest.Timeout passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, mqtttest.Timeout, what, cond)
}

func groupQuery(name string, extra ...string) string {
	q := url.Values{"group": {name}}
	for i := 0; i+1 < len(extra); i += 2 {
		q.Set(extra[i], extra[i+1])
	}
	return "?" + q.Encode()
}

func connectMember(t *testing.T, addr, id, filter string) *mqtttest.V5 {
	t.Helper()
	c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30})
	if rc := c.Subscribe(t, paho.SubscribeOptions{Topic: filter, QoS: 1}); rc[0] != 1 {
		t.Fatalf("%s: SUBACK %#x", id, rc[0])
	}
	return c
}

// connectSilentMember connects an MQTT 5 member that receives but never
// acknowledges, so its messages time out.
func connectSilentMember(t *testing.T, addr, id, filter string) (*paho.Client, chan *paho.Publish) {
	t.Helper()
	got := make(chan *paho.Publish, 100)
	c := paho.NewClient(paho.ClientConfig{
		ClientID: id, Conn: mqtttest.Dial(t, mqtttest.TCP, addr, nil), EnableManualAcknowledgment: true,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			got <- r.Packet
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatalf("connect %s: %v", id, err)
	}
	t.Cleanup(func() {
		select {
		case <-c.Done():
		default:
			_ = c.Disconnect(&paho.Disconnect{})
			<-c.Done()
		}
	})
	if sa, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil || sa.Reasons[0] != 1 {
		t.Fatalf("subscribe %s: %v %v", id, sa, err)
	}
	return c, got
}

func keyed(topic, key string, payload []byte, user ...string) *paho.Publish {
	p := &paho.Publish{Topic: topic, QoS: 1, Payload: payload, Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}}
	for i := 0; i+1 < len(user); i += 2 {
		p.Properties.User = append(p.Properties.User, paho.UserProperty{Key: user[i], Value: user[i+1]})
	}
	return p
}

// metricsLack reports the lines of want that /metrics lacks.
func metricsLack(t *testing.T, base string, want []string) []string {
	_, body := httpGet(t, base+"/metrics")
	var missing []string
	for _, w := range want {
		if !strings.Contains(body, "\n"+w+"\n") {
			missing = append(missing, w)
		}
	}
	return missing
}

func TestAdminGroupsListDetailDelete(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr, base := b.Addr("tcp"), "http://"+b.Addr("http")
	const name = "workers/orders/#"

	var empty struct{ Groups []adminapi.GroupView }
	apiJSON(t, "GET", base+"/api/v1/groups", "", 200, &empty)
	if empty.Groups == nil || len(empty.Groups) != 0 {
		t.Fatalf("groups before any subscription = %#v, want []", empty.Groups)
	}

	m1 := connectMember(t, addr, "m1", "$share/"+name)
	m2 := connectMember(t, addr, "m2", "$share/"+name)
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	const n = 10
	for i := range n {
		if rc := pub.Publish(t, keyed("orders/new", fmt.Sprintf("k%d", i), []byte("x"))); rc != 0 {
			t.Fatalf("publish reason %#x", rc)
		}
	}
	pub.Publish(t, &paho.Publish{Topic: "orders/new", QoS: 0, Payload: []byte("q0")})
	for range n + 1 {
		select {
		case <-m1.Msgs:
		case <-m2.Msgs:
		case <-time.After(mqtttest.Timeout):
			t.Fatal("members did not receive every message")
		}
	}

	var list struct{ Groups []adminapi.GroupView }
	eventually(t, "every message acked in the group list", func() bool {
		apiJSON(t, "GET", base+"/api/v1/groups", "", 200, &list)
		// The router counts a QoS 0 message once Deliver returns, which may be
		// after the member has it: wait for the counter too.
		return len(list.Groups) == 1 && list.Groups[0].Counters.Acked == n && list.Groups[0].Cursor == n && list.Groups[0].QoS0.Routed == 1
	})
	g := list.Groups[0]
	if g.Name != name || g.Share != "workers" || g.Filter != "orders/#" || !g.Running ||
		fmt.Sprint(g.Members) != "[m1 m2]" || g.Head != n || g.Backlog != 0 || g.InFlight != 0 ||
		g.Counters.Delivered != n || g.QoS0.Routed != 1 || g.DeadLetters != 0 {
		t.Errorf("group = %+v", g)
	}

	// One group in detail, named with or without $share/.
	for _, q := range []string{name, "$share/" + name} {
		var d adminapi.GroupView
		apiJSON(t, "GET", base+"/api/v1/groups/detail"+groupQuery(q), "", 200, &d)
		if d.Name != name || len(d.PerMember) != 2 || d.Settings == nil || d.Settings.MaxDeliveries != 5 || d.Settings.AckTimeout != "30s" {
			t.Fatalf("detail = %+v", d)
		}
		for _, m := range d.PerMember {
			if !m.Connected || !m.Active || m.QoS != 1 || m.Limit <= 0 || m.InFlight != 0 {
				t.Errorf("member = %+v", m)
			}
		}
	}
	// A second look a second later has rates; wait for it on the ticker, no sleep.
	eventually(t, "rates", func() bool {
		var d adminapi.GroupView
		apiJSON(t, "GET", base+"/api/v1/groups/detail"+groupQuery(name), "", 200, &d)
		return d.Rates != nil && d.Rates.WindowSeconds >= 1
	})

	eventually(t, "group metrics", func() bool {
		return len(metricsLack(t, base, []string{
			`keyline_group_members{group="workers/orders/#"} 2`,
			`keyline_group_backlog{group="workers/orders/#"} 0`,
			`keyline_group_inflight{group="workers/orders/#"} 0`,
			`keyline_group_delivered_total{group="workers/orders/#"} 10`,
			`keyline_group_acks_total{group="workers/orders/#"} 10`,
			`keyline_group_qos0_routed_total{group="workers/orders/#"} 1`,
			`keyline_group_dead_letters{group="workers/orders/#"} 0`,
			`keyline_keyshared_append_errors_total 0`,
			`keyline_group_log_appends_total 10`, // the QoS 1 ones
		})) == 0
	})

	// Members hold the group: 409 until they unsubscribe.
	apiErr(t, "DELETE", base+"/api/v1/groups"+groupQuery(name), "", http.StatusConflict, "m1, m2")
	for _, m := range []*mqtttest.V5{m1, m2} {
		ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
		if _, err := m.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{"$share/" + name}}); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	var del adminapi.DeleteGroupResult
	apiJSON(t, "DELETE", base+"/api/v1/groups"+groupQuery(name), "", 200, &del)
	if del.Deleted != name {
		t.Errorf("delete = %+v", del)
	}
	apiJSON(t, "GET", base+"/api/v1/groups", "", 200, &list)
	if len(list.Groups) != 0 {
		t.Errorf("groups after delete = %+v", list.Groups)
	}
	apiErr(t, "GET", base+"/api/v1/groups/detail"+groupQuery(name), "", 404, "no group")
	apiErr(t, "DELETE", base+"/api/v1/groups"+groupQuery(name), "", 404, "no group")
	if lack := metricsLack(t, base, []string{`keyline_group_members{group="workers/orders/#"} 2`}); len(lack) == 0 {
		t.Error("metrics still show the deleted group")
	}
}

func TestAdminDeadLetters(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxDeliveries = 1
	cfg.AckTimeout = 200 * time.Millisecond
	b := startBroker(t, cfg)
	addr, base := b.Addr("tcp"), "http://"+b.Addr("http")
	const name, filter = "dl/jobs/#", "$share/dl/jobs/#"
	dlq := base + "/api/v1/dlq"

	silent, got := connectSilentMember(t, addr, "silent", filter)
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	binary := []byte{0xff, 0xfe, 0x00, 0x01}
	msgs := []*paho.Publish{
		keyed("jobs/a", "k1", []byte("one"), "trace", "t1"),
		keyed("jobs/b", "k2", binary),
		keyed("jobs/c", "k3", []byte("three")),
		keyed("jobs/d", "k4", []byte("four")),
	}
	for _, m := range msgs {
		if rc := pub.Publish(t, m); rc != 0 {
			t.Fatalf("publish reason %#x", rc)
		}
	}
	for range msgs {
		select {
		case <-got:
		case <-time.After(mqtttest.Timeout):
			t.Fatal("the silent member did not receive every message")
		}
	}
	// Never acked: each times out once and, with max-deliveries 1, dies.
	var page adminapi.DeadLetterPage
	eventually(t, "4 dead letters", func() bool {
		apiJSON(t, "GET", dlq+groupQuery(name), "", 200, &page)
		return page.Total == 4 && len(page.DeadLetters) == 4
	})
	byKey := map[string]adminapi.DeadLetterView{}
	for _, d := range page.DeadLetters {
		byKey[d.Key] = d
		if d.Attempts != 1 || d.ReasonCode != 0 || d.DeadAt.IsZero() || d.FirstDelivery.IsZero() || d.PublishedAt.IsZero() || d.QoS != 1 {
			t.Errorf("dead letter = %+v", d)
		}
	}
	if d := byKey["k1"]; d.Topic != "jobs/a" || d.Payload != "one" || d.PayloadEncoding != "utf-8" ||
		fmt.Sprint(d.UserProperties) != "[{key k1} {trace t1}]" {
		t.Errorf("k1 = %+v", d)
	}
	if d := byKey["k2"]; d.PayloadEncoding != "base64" || d.Payload != base64.StdEncoding.EncodeToString(binary) || d.PayloadSize != 4 {
		t.Errorf("k2 = %+v", d)
	}
	ids := map[string]uint64{}
	for k, d := range byKey {
		ids[k] = d.ID
	}

	// Paging.
	var p1, p2 adminapi.DeadLetterPage
	apiJSON(t, "GET", dlq+groupQuery(name, "limit", "3"), "", 200, &p1)
	if len(p1.DeadLetters) != 3 || !p1.More || p1.NextAfter != p1.DeadLetters[2].ID {
		t.Fatalf("page 1 = %+v", p1)
	}
	apiJSON(t, "GET", dlq+groupQuery(name, "limit", "3", "after", fmt.Sprint(p1.NextAfter)), "", 200, &p2)
	if len(p2.DeadLetters) != 1 || p2.More || p2.DeadLetters[0].ID <= p1.NextAfter {
		t.Fatalf("page 2 = %+v", p2)
	}

	eventually(t, "dead-letter metrics", func() bool {
		return len(metricsLack(t, base, []string{
			`keyline_group_dead_letters{group="dl/jobs/#"} 4`,
			`keyline_group_dead_lettered_total{group="dl/jobs/#"} 4`,
			`keyline_group_ack_timeouts_total{group="dl/jobs/#"} 4`,
			`keyline_group_members{group="dl/jobs/#"} 1`,
			`keyline_group_backlog{group="dl/jobs/#"} 0`,
		})) == 0
	})

	// Purge one.
	var pr adminapi.PurgeResult
	apiJSON(t, "POST", base+"/api/v1/dlq/purge"+groupQuery(name, "id", fmt.Sprint(ids["k2"])), "", 200, &pr)
	if pr.Purged != 1 {
		t.Errorf("purge = %+v", pr)
	}
	apiErr(t, "POST", base+"/api/v1/dlq/purge"+groupQuery(name, "id", fmt.Sprint(ids["k2"])), "", 404, "no dead letter")

	// Replay to a member that acks.
	ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
	defer cancel()
	if _, err := silent.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{filter}}); err != nil {
		t.Fatal(err)
	}
	worker := connectMember(t, addr, "worker", filter)
	var rr adminapi.ReplayResult
	apiJSON(t, "POST", base+"/api/v1/dlq/replay"+groupQuery(name, "id", fmt.Sprint(ids["k1"])), "", 200, &rr)
	if rr.Count != 1 || len(rr.Replayed) != 1 || rr.Replayed[0].ID != ids["k1"] || rr.Replayed[0].Offset != 5 || rr.Replayed[0].Key != "k1" {
		t.Fatalf("replay one = %+v", rr)
	}
	if m := worker.Next(t); string(m.Payload) != "one" || m.Topic != "jobs/a" {
		t.Errorf("replayed message = %s %q", m.Topic, m.Payload)
	}
	apiErr(t, "POST", base+"/api/v1/dlq/replay"+groupQuery(name, "id", fmt.Sprint(ids["k1"])), "", 404, "no dead letter")
	apiJSON(t, "POST", base+"/api/v1/dlq/replay"+groupQuery(name), "", 200, &rr)
	if rr.Count != 2 || len(rr.Replayed) != 2 || rr.Replayed[0].Key != "k3" || rr.Replayed[1].Key != "k4" {
		t.Fatalf("replay all = %+v", rr)
	}
	recv := map[string]bool{}
	for range 2 {
		recv[string(worker.Next(t).Payload)] = true
	}
	if !recv["three"] || !recv["four"] {
		t.Errorf("replayed messages = %v", recv)
	}
	apiJSON(t, "GET", dlq+groupQuery(name), "", 200, &page)
	if page.Total != 0 || len(page.DeadLetters) != 0 || page.DeadLetters == nil {
		t.Errorf("dead letters after replay = %+v", page)
	}
	eventually(t, "replayed messages acked", func() bool {
		var d adminapi.GroupView
		apiJSON(t, "GET", base+"/api/v1/groups/detail"+groupQuery(name), "", 200, &d)
		return d.Backlog == 0 && d.Head == 7 && d.Counters.Acked == 3
	})

	// Purge all: one more dead letter from a silent member.
	if _, err := worker.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{filter}}); err != nil {
		t.Fatal(err)
	}
	_, got2 := connectSilentMember(t, addr, "silent-2", filter)
	pub.Publish(t, keyed("jobs/e", "k5", []byte("five")))
	select {
	case <-got2:
	case <-time.After(mqtttest.Timeout):
		t.Fatal("silent-2 got nothing")
	}
	eventually(t, "a new dead letter", func() bool {
		apiJSON(t, "GET", dlq+groupQuery(name), "", 200, &page)
		return page.Total == 1
	})
	apiJSON(t, "POST", base+"/api/v1/dlq/purge"+groupQuery(name), "", 200, &pr)
	if pr.Purged != 1 {
		t.Errorf("purge all = %+v", pr)
	}
	apiJSON(t, "GET", dlq+groupQuery(name), "", 200, &page)
	if page.Total != 0 {
		t.Errorf("dead letters after purge = %+v", page)
	}
}

func TestAdminAPITokenAndBadRequests(t *testing.T) {
	cfg := testConfig(t)
	cfg.HTTPToken = "s3cret"
	b := startBroker(t, cfg)
	base := "http://" + b.Addr("http")
	const tok = "s3cret"
	connectMember(t, b.Addr("tcp"), "m1", "$share/g/t/+")
	const name = "g/t/+"

	for _, u := range []string{"/api/v1/groups", "/api/v1/clients", "/api/v1/clients/m1", "/api/v1/groups/detail" + groupQuery(name), "/api/v1/dlq" + groupQuery(name)} {
		apiErr(t, "GET", base+u, "", 401, "missing bearer token")
		apiErr(t, "GET", base+u, "wrong", 401, "wrong bearer token")
		apiJSON(t, "GET", base+u, tok, 200, nil)
	}
	apiErr(t, "POST", base+"/api/v1/dlq/purge"+groupQuery(name), "", 401, "missing bearer token")
	apiErr(t, "DELETE", base+"/api/v1/groups"+groupQuery(name), "wrong", 401, "wrong bearer token")
	for _, u := range []string{"/metrics", "/healthz", "/readyz"} {
		if code, _ := httpGet(t, base+u); code != 200 {
			t.Errorf("GET %s without a token = %d, want 200", u, code)
		}
	}

	for _, tc := range []struct {
		method, path string
		code         int
		want         string
	}{
		{"GET", "/api/v1/groups/detail", 400, `missing query parameter "group"`},
		{"GET", "/api/v1/groups/detail?group=", 400, `missing query parameter "group"`},
		{"GET", "/api/v1/groups/detail?group=noslash", 400, `"group"`},
		{"GET", "/api/v1/groups/detail?group=a%2B%2Fb", 400, `share name "a+"`},
		{"GET", "/api/v1/groups/detail" + groupQuery(name, "grp", "x"), 400, `unknown query parameter "grp"`},
		{"GET", "/api/v1/groups/detail?group=a/b&group=c/d", 400, `"group" given 2 times`},
		{"GET", "/api/v1/groups?x=1", 400, `unknown query parameter "x"`},
		{"GET", "/api/v1/dlq" + groupQuery(name, "limit", "abc"), 400, `"limit"`},
		{"GET", "/api/v1/dlq" + groupQuery(name, "limit", "0"), 400, `"limit"`},
		{"GET", "/api/v1/dlq" + groupQuery(name, "limit", "1001"), 400, `"limit"`},
		{"GET", "/api/v1/dlq" + groupQuery(name, "after", "-1"), 400, `"after"`},
		{"POST", "/api/v1/dlq/replay" + groupQuery(name, "id", "x"), 400, `"id"`},
		{"POST", "/api/v1/dlq/purge" + groupQuery(name, "id", "1.5"), 400, `"id"`},
		{"GET", "/api/v1/dlq?group=%zz", 400, "malformed query"},
		{"GET", "/api/v1/groups/detail?group=nope/x", 404, `no group "nope/x"`},
		{"GET", "/api/v1/groups/detail?group=g/t/", 404, "%23"}, // a '#' lost as a URL fragment
		{"DELETE", "/api/v1/groups?group=nope/x", 404, "no group"},
		{"GET", "/api/v1/dlq?group=nope/x", 404, "no group"},
		{"POST", "/api/v1/dlq/replay?group=nope/x", 404, "no group"},
		{"POST", "/api/v1/dlq/replay" + groupQuery(name, "id", "99"), 404, "no dead letter with id 99"},
		{"POST", "/api/v1/dlq/purge?group=nope/x", 404, "no group"},
		{"POST", "/api/v1/dlq/purge" + groupQuery(name, "id", "99"), 404, "no dead letter with id 99"},
		{"GET", "/api/v1/nothing", 404, "no API endpoint"},
		{"POST", "/api/v1/groups", 405, "allowed: GET, DELETE"},
		{"GET", "/api/v1/dlq/replay", 405, "allowed: POST"},
	} {
		apiErr(t, tc.method, base+tc.path, tok, tc.code, tc.want)
	}

	// A browser page on another origin cannot change anything, token or not.
	req, _ := http.NewRequest("POST", base+"/api/v1/dlq/purge"+groupQuery(name), nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Origin", "https://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin POST = %d, want 403", resp.StatusCode)
	}
}
