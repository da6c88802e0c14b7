package broker

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// The web console in headless Chromium against a broker with real traffic
// (console_fixture_test.go): each page shows what the API says, and the
// actions work end to end.

// number parses a figure as the console prints it ("1,234").
func number(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(strings.ReplaceAll(s, ",", ""), 10, 64)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return n
}

func TestConsoleInABrowser(t *testing.T) {
	br := startBrowser(t)
	f := startConsoleFixture(t, "")
	base := f.base
	g := url.QueryEscape(fixtureGroup)

	t.Run("overview matches the API", func(t *testing.T) {
		br.do(t, chromedp.Navigate(base+"/"))
		var o adminapi.OverviewView
		apiJSON(t, "GET", base+adminapi.PathOverview, "", 200, &o)
		for sel, want := range map[string]uint64{"#ov-clients": uint64(o.ClientsConnected), "#ov-groups": uint64(o.Groups), "#ov-deadletters": o.DeadLetters} {
			if got := number(t, br.text(t, sel)); got != want {
				t.Errorf("%s shows %d, the API %d", sel, got, want)
			}
		}
		if o.DeadLetters != 4 || o.Groups != 2 || o.ClientsConnected != 5 {
			t.Errorf("the fixture is not what the test expects: %+v", o)
		}
		// The script runs (the CSP lets it), polls the API and redraws the charts.
		br.waitJS(t, "the live indicator", `document.getElementById('live').textContent.startsWith('live')`)
		br.waitJS(t, "a chart drawn", `document.querySelector('#chart-clients polyline').getAttribute('points').split(' ').length >= 2`)
		if r := run(t, br, chromedp.Evaluate[string](`getComputedStyle(document.querySelector('.card')).borderTopLeftRadius`)); r != "8px" {
			t.Errorf("the stylesheet is not applied: a card's radius is %q", r)
		}
	})

	t.Run("groups and a group page match the API", func(t *testing.T) {
		br.do(t, chromedp.Navigate(base+"/groups"))
		var v adminapi.GroupView
		apiJSON(t, "GET", base+adminapi.PathGroupDetail+"?group="+g, "", 200, &v)
		row := `#groups tr[data-group="` + fixtureGroup + `"] `
		if got := number(t, br.text(t, row+`td[data-col="dead_letters"]`)); got != v.DeadLetters || got != 4 {
			t.Errorf("groups page: %d dead letters, the API %d", got, v.DeadLetters)
		}
		if got := number(t, br.text(t, row+`td[data-col="members"]`)); got != uint64(len(v.Members)) || got != 1 {
			t.Errorf("groups page: %d members, the API %v", got, v.Members)
		}
		br.do(t, chromedp.Click(chromedp.CSS(row+"a")), chromedp.WaitVisible(chromedp.CSS("#g-deadletters")))
		if got := br.text(t, "#group-name"); got != fixtureGroup {
			t.Errorf("group page of %q", got)
		}
		for sel, want := range map[string]uint64{"#g-deadletters": v.DeadLetters, "#g-backlog": v.Backlog, "#g-members": uint64(len(v.Members)), "#g-delivered": v.Counters.Delivered} {
			if got := number(t, br.text(t, sel)); got != want {
				t.Errorf("group page: %s shows %d, the API %d", sel, got, want)
			}
		}
		if got := br.text(t, `#members tr[data-member="worker-1"] a`); got != "worker-1" {
			t.Errorf("member row %q", got)
		}
		if n := run(t, br, chromedp.Evaluate[int](`document.querySelectorAll('#delete-group').length`)); n != 0 {
			t.Error("a group with a member offers to delete it")
		}
	})

	var dead adminapi.DeadLetterPage
	apiJSON(t, "GET", base+adminapi.PathDLQ+"?group="+g, "", 200, &dead)
	ids := map[string]uint64{}
	for _, l := range dead.DeadLetters {
		ids[l.Key] = l.ID
	}

	t.Run("dead letters match the API, payloads shown safely", func(t *testing.T) {
		br.do(t, chromedp.Navigate(base+"/dlq"), chromedp.Click(chromedp.CSS(`#dlq-groups tr[data-group="`+fixtureGroup+`"] a`)),
			chromedp.WaitVisible(chromedp.CSS("#dead-letters")))
		if n := run(t, br, chromedp.Evaluate[int](`document.querySelectorAll('#dead-letters tbody tr').length`)); n != len(dead.DeadLetters) || n != 4 {
			t.Fatalf("%d rows, the API %d dead letters", n, len(dead.DeadLetters))
		}
		for _, l := range dead.DeadLetters {
			row := fmt.Sprintf(`#dead-letters tr[data-id="%d"] `, l.ID)
			if k, tp, a := br.text(t, row+`td[data-col="key"]`), br.text(t, row+`td[data-col="topic"]`), br.text(t, row+`td[data-col="attempts"]`); k != l.Key || tp != l.Topic || a != strconv.Itoa(l.Attempts) {
				t.Errorf("row %d shows %s %s %s, the API %s %s %d", l.ID, k, tp, a, l.Key, l.Topic, l.Attempts)
			}
		}
		if got := br.text(t, fmt.Sprintf(`#dead-letters tr[data-id="%d"] td[data-col="payload"]`, ids["order-2"])); got != "hex ff fe 00 01 02" {
			t.Errorf("binary payload shown as %q", got)
		}
		if got := br.text(t, fmt.Sprintf(`#dead-letters tr[data-id="%d"] td[data-col="payload"]`, ids["order-1"])); got != string(f.letters["order-1"]) {
			t.Errorf("markup in a payload shown as %q, want it literally", got)
		}
		if n := run(t, br, chromedp.Evaluate[int](`document.querySelectorAll('main b:not(.mono)').length - document.querySelectorAll('#dlq-total b').length`)); n != 0 {
			t.Error("a payload's <b> became an element")
		}
		br.do(t, chromedp.Click(chromedp.CSS(fmt.Sprintf(`#dead-letters tr[data-id="%d"] td a`, ids["order-2"]))), chromedp.WaitVisible(chromedp.CSS("#l-hex")))
		if got := br.text(t, "#l-hex"); !strings.Contains(got, "ff fe 00 01 02") || br.text(t, "#l-key") != "order-2" {
			t.Errorf("letter page hex %q", got)
		}
	})

	t.Run("replay one from the console, a member receives it", func(t *testing.T) {
		id := ids["order-3"]
		br.do(t, chromedp.Navigate(base+"/dlq?group="+g),
			chromedp.Click(chromedp.CSS(fmt.Sprintf(`#dead-letters tr[data-id="%d"] a[data-action="replay"]`, id))),
			chromedp.WaitVisible(chromedp.CSS("#confirm")))
		if q := br.text(t, "#question"); q != fmt.Sprintf("Replay dead letter %d of group %s?", id, fixtureGroup) {
			t.Errorf("confirmation %q", q)
		}
		select {
		case m := <-f.worker.Msgs:
			t.Fatalf("the member received %q before the replay was confirmed", m.Payload)
		default:
		}
		br.do(t, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#result")))
		if got := br.text(t, "#result"); got != "Replayed 1 dead letter of group "+fixtureGroup+"." {
			t.Errorf("result %q", got)
		}
		if m := f.worker.Next(t); string(m.Payload) != "plain text three" || m.Topic != "jobs/order-3" {
			t.Errorf("the member received %s %q", m.Topic, m.Payload)
		}
		var p adminapi.DeadLetterPage
		apiJSON(t, "GET", base+adminapi.PathDLQ+"?group="+g, "", 200, &p)
		if p.Total != 3 {
			t.Errorf("%d dead letters after the replay, want 3", p.Total)
		}
	})

	t.Run("purge all, with a confirmation", func(t *testing.T) {
		br.do(t, chromedp.Navigate(base+"/dlq?group="+g), chromedp.Click(chromedp.CSS("#purge-all")), chromedp.WaitVisible(chromedp.CSS("#confirm")))
		if q := br.text(t, "#question"); q != "Purge all 3 dead letters of group "+fixtureGroup+"?" {
			t.Errorf("confirmation %q", q)
		}
		br.do(t, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#result")))
		if got := br.text(t, "#result"); got != "Purged 3 dead letters of group "+fixtureGroup+"." {
			t.Errorf("result %q", got)
		}
		var p adminapi.DeadLetterPage
		apiJSON(t, "GET", base+adminapi.PathDLQ+"?group="+g, "", 200, &p)
		if p.Total != 0 {
			t.Errorf("%d dead letters after purging all", p.Total)
		}
	})

	t.Run("clients: search, slow state, client page", func(t *testing.T) {
		br.do(t, chromedp.Navigate(base+"/clients"), chromedp.SendKeys(chromedp.CSS(`input[name="q"]`), "slow"))
		// The unfiltered page lists slow-1 too: wait for the search's answer to load.
		run(t, br, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.CSS(`form.filter button`))))
		if loc := run(t, br, chromedp.Location()); loc != base+"/clients?q=slow" {
			t.Fatalf("the search loaded %s", loc)
		}
		if got := br.text(t, "#clients-count"); !strings.HasPrefix(got, "1 of 5 clients") {
			t.Errorf("search: %q", got)
		}
		v := clientView(t, f.b, "slow-1")
		row := `#clients tr[data-client="slow-1"] `
		if got := number(t, br.text(t, row+`td[data-col="dropped"]`)); got != v.DroppedMessages || got == 0 {
			t.Errorf("clients page: slow-1 dropped %d, the API %d", got, v.DroppedMessages)
		}
		want := "has dropped messages"
		if v.QueuedBytes > v.QueueSoft {
			want = "slow: queue over its soft limit"
		}
		if got := br.text(t, row+`[data-col="state"]`); got != want {
			t.Errorf("state %q, want %q (queued %d, soft %d)", got, want, v.QueuedBytes, v.QueueSoft)
		}
		br.do(t, chromedp.Click(chromedp.CSS(row+"a")), chromedp.WaitVisible(chromedp.CSS("#c-dropped")))
		if got := number(t, br.text(t, "#c-dropped")); got != v.DroppedMessages {
			t.Errorf("client page: dropped %d, the API %d", got, v.DroppedMessages)
		}
		if got := br.text(t, "#subscriptions td"); got != "big/#" {
			t.Errorf("client page: subscription %q", got)
		}
	})

	t.Run("disconnect a client, with a confirmation", func(t *testing.T) {
		br.do(t, chromedp.Navigate(base+"/clients/view?id=victim-1"), chromedp.Click(chromedp.CSS("#disconnect")), chromedp.WaitVisible(chromedp.CSS("#confirm")))
		if q := br.text(t, "#question"); q != "Disconnect client victim-1?" {
			t.Errorf("confirmation %q", q)
		}
		select {
		case <-f.victim.Done():
			t.Fatal("disconnected before the confirmation")
		default:
		}
		br.do(t, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#result")))
		if got := br.text(t, "#result"); got != "Disconnected client victim-1; its persistent session stays." {
			t.Errorf("result %q", got)
		}
		select {
		case <-f.victim.Done():
		case <-time.After(mqtttest.Timeout):
			t.Fatal("victim-1 is still connected")
		}
		var de *mqtttest.DisconnectError
		if err := f.victim.Err(); !errors.As(err, &de) || de.ReasonCode != 0x98 {
			t.Errorf("victim-1 saw %v, want DISCONNECT 0x98", err)
		}
	})

	t.Run("topics: a live view, text and binary shown safely", func(t *testing.T) {
		br.do(t, chromedp.Navigate(base+"/topics"), chromedp.SendKeys(chromedp.CSS(`input[name="filter"]`), "live/#"),
			chromedp.Click(chromedp.CSS(`form.filter button`)), chromedp.WaitVisible(chromedp.CSS("#stream-lines")))
		br.waitJS(t, "the stream open", `document.getElementById('stream-state').textContent === 'live'`)
		f.pub.Publish(t, &paho.Publish{Topic: "live/a", QoS: 1, Payload: []byte("<b>hello</b>")})
		f.pub.Publish(t, &paho.Publish{Topic: "elsewhere", QoS: 1, Payload: []byte("not shown")})
		f.pub.Publish(t, &paho.Publish{Topic: "live/bin", QoS: 0, Payload: []byte{0xff, 0x00}})
		br.waitJS(t, "both messages", `document.querySelectorAll('#stream-lines li').length === 2`)
		lines := run(t, br, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#stream-lines li')].map(li => li.textContent)`))
		if lines[0] != "live/a <b>hello</b>" || lines[1] != "live/bin hex ff 00" {
			t.Errorf("stream lines %q", lines)
		}
		if n := run(t, br, chromedp.Evaluate[int](`document.querySelectorAll('#stream-lines b').length`)); n != 0 {
			t.Error("a payload's markup became an element")
		}
	})

	t.Run("delete an empty group", func(t *testing.T) {
		br.do(t, chromedp.Navigate(base+"/groups/view?group="+url.QueryEscape(fixtureIdleGroup)), chromedp.Click(chromedp.CSS("#delete-group")),
			chromedp.WaitVisible(chromedp.CSS("#confirm")))
		br.do(t, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#result")))
		if got := br.text(t, "#result"); !strings.HasPrefix(got, "Deleted group "+fixtureIdleGroup) {
			t.Errorf("result %q", got)
		}
		apiErr(t, "GET", base+adminapi.PathGroupDetail+"?group="+url.QueryEscape(fixtureIdleGroup), "", 404, "no group")
	})

	t.Run("a throttled client's inbound rate, live", func(t *testing.T) {
		const limit = 20
		f.b.rates.Set(hooks.RateSettings{MessagesPerClient: limit})
		defer f.b.rates.Set(f.b.cfg.RateLimits.settings())
		flood := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, f.b.Addr("tcp"), nil), &paho.Connect{ClientID: "flood-1", CleanStart: true, KeepAlive: 30})
		defer flood.Close()
		stop, done := make(chan struct{}), make(chan struct{})
		go func() { // past the limit until the page has shown it: the broker holds it at 20/s
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				flood.Publish(t, &paho.Publish{Topic: "flood/x", QoS: 1, Payload: []byte("f")})
			}
		}()
		br.do(t, chromedp.Navigate(base+"/clients/view?id=flood-1"), chromedp.WaitVisible(chromedp.CSS("#c-msgs-in")))
		// The page polls the API every 2 s: wait for a figure it put in.
		br.waitJS(t, "a throttled time shown", `parseFloat(document.getElementById('c-throttled').textContent) > 0`)
		br.waitJS(t, "an inbound rate shown", `parseFloat(document.getElementById('c-msgs-in').textContent) > 0`)
		shown, _ := strconv.ParseFloat(br.text(t, "#c-msgs-in"), 64)
		close(stop)
		<-done
		if shown > 2*limit {
			t.Errorf("the page shows flood-1 at %v msg/s, past its limit of %d/s and a full bucket", shown, limit)
		}
		v := clientView(t, f.b, "flood-1")
		if v.ThrottledSeconds <= 0 {
			t.Errorf("the API shows flood-1 throttled %vs", v.ThrottledSeconds)
		}
		br.do(t, chromedp.Navigate(base+"/clients?q=flood-1"))
		if got := br.text(t, `#clients tr[data-client="flood-1"] td[data-col="throttled"]`); got == "0.0 s" {
			t.Errorf("clients page: flood-1 throttled %q", got)
		}
	})
}

// TestConsoleLoginInABrowser: with a token set, a page refuses without it
// (the browser lands on the login page, the API answers 401), a wrong token
// is refused, the right one opens the console with an HttpOnly cookie, and
// logging out closes it again.
func TestConsoleLoginInABrowser(t *testing.T) {
	br := startBrowser(t)
	cfg := testConfig(t)
	cfg.HTTPToken = "s3cret-token"
	b := startBroker(t, cfg)
	base := "http://" + b.Addr("http")
	connectMember(t, b.Addr("tcp"), "m1", "$share/auth/x/#")

	br.do(t, chromedp.Navigate(base+"/groups"), chromedp.WaitVisible(chromedp.CSS("#token")))
	if loc := run(t, br, chromedp.Location()); loc != base+"/login?next=%2Fgroups" {
		t.Errorf("without the token /groups lands on %s", loc)
	}
	if n := run(t, br, chromedp.Evaluate[int](`document.querySelectorAll('#groups').length`)); n != 0 {
		t.Error("the login page lists groups")
	}
	status := run(t, br, chromedp.Evaluate[int](`fetch('/api/v1/overview').then(r => r.status)`, chromedp.EvalAwaitPromise))
	if status != 401 {
		t.Errorf("the API from the page without logging in: %d, want 401", status)
	}

	br.do(t, chromedp.SendKeys(chromedp.CSS("#token"), "wrong"), chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(chromedp.CSS("#login-error")))
	br.do(t, chromedp.SendKeys(chromedp.CSS("#token"), "s3cret-token"), chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(chromedp.CSS("#groups-count")))
	if loc := run(t, br, chromedp.Location()); loc != base+"/groups" {
		t.Errorf("after the login: %s, want /groups", loc)
	}
	if got := br.text(t, `#groups tr[data-group="auth/x/#"] td[data-col="members"]`); got != "1" {
		t.Errorf("members %q", got)
	}
	if c := run(t, br, chromedp.Evaluate[string](`document.cookie`)); strings.Contains(c, adminapi.SessionCookie) {
		t.Errorf("the session cookie is readable from scripts: %q", c)
	}
	br.do(t, chromedp.Navigate(base+"/"))
	br.waitJS(t, "the live indicator, polling with the cookie", `document.getElementById('live').textContent.startsWith('live')`)

	br.do(t, chromedp.Click(chromedp.CSS("form.logout button")), chromedp.WaitVisible(chromedp.CSS("#token")))
	br.do(t, chromedp.Navigate(base+"/clients"), chromedp.WaitVisible(chromedp.CSS("#token")))
	if loc := run(t, br, chromedp.Location()); loc != base+"/login?next=%2Fclients" {
		t.Errorf("after logging out /clients lands on %s", loc)
	}
}
