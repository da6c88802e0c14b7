package broker

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// Tools behind flags, run by hand (they skip otherwise):
//
//	docs/screenshots.sh   go test ./broker -run TestConsoleScreenshots -args -console.screenshots=DIR
//	                      writes a PNG of every console page into DIR, with sample traffic
//	go test ./broker -run TestConsolePageWeight -count=1 -v -args -console.weight
//	                      page weight and time to first render with 1,000 groups and
//	                      10,000 dead letters, as a table for BENCHMARKS.md

var (
	screenshotDir = flag.String("console.screenshots", "", "write screenshots of the console's pages into this directory")
	screenWarmup  = flag.Duration("console.warmup", 2*time.Minute, "traffic before the screenshots, so the charts have a history")
	weigh         = flag.Bool("console.weight", false, "measure the console's page weight and time to first render")
)

// sampleTraffic runs devices, dashboards and keyed workers against f's broker
// until the test ends: QoS 0 telemetry at about 160 msg/s, keyed QoS 1 orders
// at about 40 msg/s for a group whose members ack a little slower than that,
// and a feed the slow subscriber drops from.
func sampleTraffic(t *testing.T, f *consoleFixture) {
	addr := f.b.Addr("tcp")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	worker := func(id, filter string, ackEvery time.Duration, keyFilters ...string) {
		w, err := mqtttest.DialWorker(addr, id, mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30, ReceiveMaximum: 40})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		if rc, err := w.Subscribe(filter, 1, keyFilters...); err != nil || rc != 1 {
			t.Fatalf("subscribe %s: %#x %v", filter, rc, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(ackEvery)
			defer tick.Stop()
			for m := range w.Messages() {
				select {
				case <-tick.C:
				case <-stop:
					return
				}
				_ = w.Ack(m)
			}
		}()
	}
	worker("billing-a", "$share/billing/invoices/#", 60*time.Millisecond)
	worker("billing-b", "$share/billing/invoices/#", 60*time.Millisecond)
	worker("shipping-eu", "$share/shipping/labels/+", time.Millisecond, "eu-*")
	worker("shipping-us", "$share/shipping/labels/+", time.Millisecond, "us-*")
	dash, err := mqtttest.DialWorker(addr, "dashboard-1", mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dash.Close)
	if _, err := dash.Subscribe("sensors/#", 0); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { // the dashboard reads everything
		defer wg.Done()
		for range dash.Messages() {
		}
	}()
	publish := func(id string, every time.Duration, next func(i int) mqtttest.Outgoing) {
		w, err := mqtttest.DialWorker(addr, id, mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-tick.C:
				case <-stop:
					return
				}
				if _, err := w.PublishMessage(next(i)); err != nil {
					return
				}
			}
		}()
	}
	for d := range 8 {
		publish(fmt.Sprintf("device-%02d", d), 50*time.Millisecond, func(i int) mqtttest.Outgoing {
			return mqtttest.Outgoing{Topic: fmt.Sprintf("sensors/device-%02d/temp", d), Payload: fmt.Appendf(nil, "%.1f", 20+float64((i+d)%50)/10)}
		})
	}
	publish("order-service", 25*time.Millisecond, func(i int) mqtttest.Outgoing {
		key := fmt.Sprintf("customer-%d", i%37)
		return mqtttest.Outgoing{Topic: "invoices/eu/new", QoS: 1, Payload: fmt.Appendf(nil, `{"invoice":%d,"customer":%q}`, i, key),
			User: []mqtttest.UserProperty{{Key: "key", Value: key}}}
	})
	// slow-1 never reads: a feed it cannot keep up with makes it drop all the
	// time, and PINGREQs keep its keep-alive (60 s) from ending it.
	publish("video-feed", 200*time.Millisecond, func(int) mqtttest.Outgoing {
		return mqtttest.Outgoing{Topic: "big/frames", Payload: make([]byte, 16<<10)}
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(20 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				if _, err := f.slow.Write([]byte{0xc0, 0}); err != nil {
					return
				}
			case <-stop:
				return
			}
		}
	}()
	publish("label-service", 100*time.Millisecond, func(i int) mqtttest.Outgoing {
		key := []string{"eu-", "us-"}[i%2] + fmt.Sprint(i%11)
		return mqtttest.Outgoing{Topic: "labels/" + key[:2], QoS: 1, Payload: fmt.Appendf(nil, "label %d", i),
			User: []mqtttest.UserProperty{{Key: "key", Value: key}}}
	})
}

func TestConsoleScreenshots(t *testing.T) {
	if *screenshotDir == "" {
		t.Skip("writes the README's screenshots: docs/screenshots.sh (-console.screenshots=DIR)")
	}
	br := startBrowser(t)
	f := startConsoleFixture(t, "")
	sampleTraffic(t, f)
	// Ask for the groups' activity now, so their charts have a history too.
	for _, g := range []string{"billing/invoices/#", fixtureGroup} {
		apiJSON(t, "GET", f.base+adminapi.PathGroupActivity+"?group="+url.QueryEscape(g), "", 200, nil)
	}
	t.Logf("running sample traffic for %v", *screenWarmup)
	time.Sleep(*screenWarmup) // a warm-up for the pictures, not synchronisation
	var page adminapi.DeadLetterPage
	apiJSON(t, "GET", f.base+adminapi.PathDLQ+"?group="+url.QueryEscape(fixtureGroup), "", 200, &page)
	shots := []struct{ file, path, ready string }{
		{"overview.png", "/", `document.getElementById('live').textContent.startsWith('live')`},
		{"groups.png", "/groups", `true`},
		{"group.png", "/groups/view?group=" + url.QueryEscape("billing/invoices/#"), `document.getElementById('live').textContent.startsWith('live')`},
		{"dead-letters.png", "/dlq?group=" + url.QueryEscape(fixtureGroup), `true`},
		{"dead-letter.png", fmt.Sprintf("/dlq/letter?group=%s&id=%d", url.QueryEscape(fixtureGroup), page.DeadLetters[1].ID), `true`},
		{"clients.png", "/clients", `true`},
		{"client.png", "/clients/view?id=slow-1", `true`},
		{"topics.png", "/topics?filter=" + url.QueryEscape("sensors/#"), `document.querySelectorAll('#stream-lines li').length >= 40`},
	}
	if err := os.MkdirAll(*screenshotDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range shots {
		br.do(t, chromedp.Navigate(f.base+s.path))
		br.waitJS(t, s.file, s.ready)
		png := run(t, br, chromedp.FullScreenshot(100))
		if err := os.WriteFile(filepath.Join(*screenshotDir, s.file), png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s (%d KiB)", s.file, s.path, len(png)>>10)
	}
}

// timing is what the browser measured of one page load, in milliseconds.
type timing struct {
	TTFB, HTML, FCP, DCL, Load float64
}

func TestConsolePageWeight(t *testing.T) {
	if !*weigh {
		t.Skip("measures the console for BENCHMARKS.md: -console.weight")
	}
	br := startBrowser(t)
	b := startBroker(t, testConfig(t))
	addr, base := b.Addr("tcp"), "http://"+b.Addr("http")

	// 1,000 groups: one member subscribes to 1,000 shared filters.
	m, err := mqtttest.DialWorker(addr, "member", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	for i := range 999 {
		if rc, err := m.Subscribe(fmt.Sprintf("$share/tenant-%03d/orders/#", i), 1); err != nil || rc != 1 {
			t.Fatalf("subscribe: %#x %v", rc, err)
		}
	}
	// 10,000 dead letters in the 1,000th group: a member rejects every message (0x99).
	rej, err := mqtttest.DialWorker(addr, "rejector", mqtttest.WorkerOptions{CleanStart: true, Buffer: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rej.Close)
	if rc, err := rej.Subscribe("$share/dead/letters/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	go func() {
		for msg := range rej.Messages() {
			_ = rej.Nack(msg, mqtttest.ReasonPayloadFormatInvalid)
		}
	}()
	const letters = 10000
	var wg sync.WaitGroup
	for p := range 4 {
		pub, err := mqtttest.DialWorker(addr, fmt.Sprintf("pub-%d", p), mqtttest.WorkerOptions{CleanStart: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pub.Close)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < letters; i += 4 {
				key := fmt.Sprintf("order-%05d", i)
				_, _ = pub.Publish("letters/"+key, fmt.Appendf(nil, `{"order":%d,"lines":[{"sku":"A-%d","qty":%d}]}`, i, i%97, i%5+1), 1,
					mqtttest.UserProperty{Key: "key", Value: key})
			}
		}()
	}
	wg.Wait()
	eventually(t, "10,000 dead letters", func() bool {
		st, err := b.keyShared.Group("dead/letters/#")
		return err == nil && st.Info.DeadLetters == letters
	})
	var gl adminapi.GroupList
	apiJSON(t, "GET", base+adminapi.PathGroups, "", 200, &gl)
	if len(gl.Groups) != 1000 {
		t.Fatalf("%d groups, want 1,000", len(gl.Groups))
	}

	size := func(path string) int {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		n, _ := io.Copy(io.Discard, resp.Body)
		return int(n)
	}
	assets := size("/static/console.js") + size("/static/console.css") + size("/static/favicon.svg")
	dl := url.QueryEscape("dead/letters/#")
	pages := []struct{ name, path string }{
		{"groups, page 1 of 10 (1,000 groups)", "/groups"},
		{"groups, page 10, sorted by backlog", "/groups?page=10&sort=backlog"},
		{"dead letters, first page of 10,000", "/dlq?group=" + dl},
		{"dead letters, ids after 9,000", "/dlq?group=" + dl + "&after=9000"},
		{"dead-letter groups (/dlq)", "/dlq"},
		{"overview, for comparison", "/"},
	}
	load, _ := os.ReadFile("/proc/loadavg")
	var out strings.Builder
	fmt.Fprintf(&out, "load average at the start: %s\n", strings.Join(strings.Fields(string(load))[:3], " "))
	out.WriteString("| page | HTML | with JS, CSS, icon | server, median of 10 | DOM ready, warm | first paint, cold | first paint, warm |\n|---|---|---|---|---|---|---|\n")
	const warmLoads = 9
	for _, p := range pages {
		html := size(p.path)
		var server []time.Duration
		for range 10 {
			start := time.Now()
			size(p.path)
			server = append(server, time.Since(start))
		}
		slices.Sort(server)
		var fcp, dcl []float64
		for i := range warmLoads + 1 {
			if i == 0 { // cold: nothing cached
				br.do(t, chromedp.Navigate("about:blank"), chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
					_, err := cdp.Call(ctx, tg, network.ClearBrowserCache, cdp.Empty{})
					return err
				}))
			}
			br.do(t, chromedp.Navigate(base+p.path))
			br.waitJS(t, "first contentful paint", `performance.getEntriesByName('first-contentful-paint').length > 0`)
			tm := run(t, br, chromedp.Evaluate[timing](`(() => { const n = performance.getEntriesByType('navigation')[0];
				return {TTFB: n.responseStart, HTML: n.responseEnd, FCP: performance.getEntriesByName('first-contentful-paint')[0].startTime,
				DCL: n.domContentLoadedEventEnd, Load: n.loadEventEnd}; })()`))
			fcp, dcl = append(fcp, tm.FCP), append(dcl, tm.DCL)
			t.Logf("%s: load %d: %+v", p.path, i, tm)
		}
		median := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
		fmt.Fprintf(&out, "| %s | %.1f KiB | %.1f KiB | %.1f ms | %.0f ms | %.0f ms | %.0f ms |\n", p.name, float64(html)/1024, float64(html+assets)/1024,
			float64(server[len(server)/2].Microseconds())/1000, median(dcl[1:]), fcp[0], median(fcp[1:]))
	}
	t.Logf("\n%s", out.String())
}
