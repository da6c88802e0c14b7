package broker

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// A broker with the traffic the console's browser tests, screenshots and
// page-weight measurements look at, made by real MQTT clients:
//   - group work/jobs/# with dead letters (a member that never acks, with
//     max-deliveries 1), then an acking member, worker-1;
//   - group idle/jobs/# without members (one subscribed and unsubscribed);
//   - slow-1, a subscriber that never reads, whose queue overflows and drops;
//   - victim-1, an MQTT 5 client with a persistent session, to disconnect.

const (
	fixtureGroup     = "work/jobs/#"
	fixtureIdleGroup = "idle/jobs/#"
)

type consoleFixture struct {
	b      *Broker
	base   string // http://host:port
	worker *mqtttest.V5
	victim *mqtttest.Worker
	slow   net.Conn
	pub    *mqtttest.V5
	// letters are the dead letters' payloads by key.
	letters map[string][]byte
}

func startConsoleFixture(t *testing.T, token string) *consoleFixture {
	t.Helper()
	cfg := testConfig(t)
	cfg.HTTPToken = token
	// Only the work share dead-letters at the first ack timeout; other groups keep the defaults.
	cfg.GroupOverrides = []GroupOverride{{Share: "work", GroupSettings: GroupSettings{MaxDeliveries: 1, AckTimeout: 200 * time.Millisecond}}}
	cfg.MaxPacketSize = 128 << 10
	small := ByteSize(256 << 10)
	cfg.ConnQueueOverrides = []ConnQueueOverride{{ClientPrefix: "slow-", SlowPolicy: connq.DropOldest, ConnQueueSoft: small / 4, ConnQueueHard: small}}
	b := startBroker(t, cfg)
	addr := b.Addr("tcp")
	f := &consoleFixture{b: b, base: "http://" + b.Addr("http"), letters: map[string][]byte{
		"order-1": []byte(`{"order":1,"note":"<b>bold</b> & \"quoted\""}`),
		"order-2": {0xff, 0xfe, 0x00, 0x01, 0x02},
		"order-3": []byte("plain text three"),
		"order-4": []byte("four"),
	}}
	f.pub = mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "publisher", CleanStart: true, KeepAlive: 30})

	silent, got := connectSilentMember(t, addr, "silent", "$share/work/jobs/#")
	for _, k := range []string{"order-1", "order-2", "order-3", "order-4"} {
		if rc := f.pub.Publish(t, keyed("jobs/"+k, k, f.letters[k], "trace", "t-"+k)); rc != 0 {
			t.Fatalf("publish: %#x", rc)
		}
	}
	for range f.letters {
		select {
		case <-got:
		case <-time.After(mqtttest.Timeout):
			t.Fatal("the silent member did not receive its messages")
		}
	}
	eventually(t, "4 dead letters", func() bool {
		st, err := b.keyShared.Group(fixtureGroup)
		return err == nil && st.Info.DeadLetters == 4
	})
	_ = silent.Disconnect(&paho.Disconnect{})
	<-silent.Done()
	eventually(t, "the silent member gone", func() bool { return len(b.keyShared.Members(fixtureGroup)) == 0 })

	f.worker = connectMember(t, addr, "worker-1", "$share/work/jobs/#")
	for i := range 5 {
		if rc := f.pub.Publish(t, keyed("jobs/ok", fmt.Sprintf("k%d", i), []byte("fine"))); rc != 0 {
			t.Fatalf("publish: %#x", rc)
		}
		f.worker.Next(t)
	}

	idle, err := mqtttest.DialWorker(addr, "idle-member", mqtttest.WorkerOptions{CleanStart: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(idle.Close)
	if rc, err := idle.Subscribe("$share/idle/jobs/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	if rc, err := idle.Unsubscribe("$share/idle/jobs/#"); err != nil || rc != 0 {
		t.Fatalf("unsubscribe: %#x %v", rc, err)
	}

	f.victim, err = mqtttest.DialWorker(addr, "victim-1", mqtttest.WorkerOptions{SessionExpiry: 600, KeepAlive: 30})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.victim.Close)
	if rc, err := f.victim.Subscribe("alerts/#", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}

	// A subscriber that never reads: publish until its queue has dropped.
	f.slow = rawSubscribe(t, addr, "slow-1", "big/#", 0)
	payload := make([]byte, 64<<10)
	eventually(t, "slow-1 dropping", func() bool {
		for range 20 {
			f.pub.Publish(t, &paho.Publish{Topic: "big/data", QoS: 0, Payload: payload})
		}
		f.pub.Publish(t, &paho.Publish{Topic: "big/end", QoS: 1, Payload: []byte("end")}) // all fanned out once acked
		for _, v := range (opsView{b}).Clients() {
			if v.ID == "slow-1" {
				return v.DroppedMessages > 0
			}
		}
		return false
	})
	return f
}

// chromium returns the browser binary to drive: $KEYLINE_CHROMIUM, else the
// first of Debian's chromium and its usual other names on PATH.
func chromium() string {
	if p := os.Getenv("KEYLINE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser is a headless Chromium tab and the problems its pages reported.
type browser struct {
	ctx context.Context
	mu  sync.Mutex
	// problems are uncaught exceptions and Content-Security-Policy violations.
	problems []string
}

// startBrowser starts headless Chromium with a fresh profile; it is closed
// when the test ends. The test is skipped when no browser is installed.
func startBrowser(t testing.TB) *browser {
	t.Helper()
	path := chromium()
	if path == "" {
		t.Skip("no chromium binary found (install Debian's chromium package or set KEYLINE_CHROMIUM); CI installs it")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	if err := chromedp.Do(ctx); err != nil { // start the browser under ctx itself
		cancel()
		cancelAlloc()
		t.Fatalf("start %s: %v", path, err)
	}
	br := &browser{ctx: ctx}
	msgs := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.IsException() || strings.Contains(m.Text, "Content Security Policy") {
				br.mu.Lock()
				br.problems = append(br.problems, fmt.Sprintf("%s:%d %s", m.URL, m.Line+1, m.Text))
				br.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		if err := chromedp.Cancel(ctx); err != nil {
			t.Logf("closing the browser: %v", err)
		}
		cancel()
		cancelAlloc()
		<-done
		br.mu.Lock()
		defer br.mu.Unlock()
		for _, p := range br.problems {
			t.Errorf("the page reported: %s", p)
		}
	})
	return br
}

// do runs steps with a deadline.
func (br *browser) do(t testing.TB, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

// run runs one action that returns a value, with a deadline.
func run[T any](t testing.TB, br *browser, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(br.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	return v
}

// text returns the text of the element sel selects, once it is visible.
func (br *browser) text(t testing.TB, sel string) string {
	t.Helper()
	br.do(t, chromedp.WaitVisible(chromedp.CSS(sel)))
	return strings.TrimSpace(run(t, br, chromedp.Text(chromedp.CSS(sel))))
}

// waitJS waits until the JavaScript expression is true in the page.
func (br *browser) waitJS(t testing.TB, what, expr string) {
	t.Helper()
	if _, err := chromedp.Run(br.ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(mqtttest.Timeout))); err != nil {
		t.Fatalf("waiting for %s (%s): %v", what, expr, err)
	}
}
