package integration

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// openFDs counts the broker process's open file descriptors.
func openFDs(t *testing.T, p *proc) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func readyzStatus(t *testing.T, p *proc) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.addrs["http"] + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode, resp.Status
}

// TestListenerSurvivesRunningOutOfFiles runs the binary with `ulimit -n 120`
// and opens 130 raw TCP connections, more than it has descriptors for: its
// accept fails with EMFILE. Once they are closed the broker must accept MQTT
// again (it retries temporary accept errors with backoff) and /readyz must
// have stayed 200 throughout. Before the fix the listener returned on the
// first accept error and never accepted again, while /readyz said 200.
func TestListenerSurvivesRunningOutOfFiles(t *testing.T) {
	const nofile = 120
	p := startKeylineLimited(t, nofile, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	base := openFDs(t, p)

	raw := make([]net.Conn, 0, 130)
	for range 130 {
		c, err := net.DialTimeout("tcp", addr, mqtttest.Timeout) // the kernel's backlog takes them all
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, c)
	}
	// Wait until the broker holds every descriptor it may: its accepts now fail.
	waitFor(t, "the broker to run out of file descriptors", func() bool { return openFDs(t, p) >= nofile-2 })
	if code, status := readyzStatus(t, p); code != http.StatusOK {
		t.Fatalf("/readyz while accepts fail for lack of descriptors: %s, want 200 (a temporary condition)", status)
	}
	for _, c := range raw {
		_ = c.Close()
	}
	waitFor(t, "the broker to close the raw connections", func() bool { return openFDs(t, p) <= base+2 })

	w, err := mqtttest.DialWorker(addr, "after-emfile", mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30})
	if err != nil {
		t.Fatalf("MQTT connect after the broker ran out of descriptors: %v", err)
	}
	defer w.Close()
	if rc, err := w.Subscribe("after/emfile", 1); err != nil || rc != 1 {
		t.Fatalf("subscribe: %#x %v", rc, err)
	}
	if code, status := readyzStatus(t, p); code != http.StatusOK {
		t.Fatalf("/readyz after: %s", status)
	}
	if !strings.Contains(p.Logs(), "accept failed, retrying with backoff") {
		t.Errorf("no log line about the failed accepts:\n%s", p.Logs())
	}
}

// waitFor polls cond until it holds, failing the test after mqtttest.Timeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(mqtttest.Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-poll.C
	}
}
