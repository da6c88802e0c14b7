// Package integration drives the real keyline binary with real clients:
// mosquitto_pub/mosquitto_sub, paho for MQTT 3.1.1 and 5, SIGKILL and SIGTERM.
package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

var keylineBin string

func TestMain(m *testing.M) {
	natstest.MaybeRunChild() // a NATS server child of a cluster test
	dir, err := os.MkdirTemp("", "keyline-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	keylineBin = filepath.Join(dir, "keyline")
	build := exec.Command("go", "build", "-o", keylineBin, "..")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build keyline:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		code = 1
	}
	os.Exit(code)
}

// proc is a running keyline binary.
type proc struct {
	cmd   *exec.Cmd
	addrs map[string]string // listener name -> bound address, from the "keyline started" log line
	mu    sync.Mutex
	logs  strings.Builder
	ready chan map[string]string // the listeners' addresses, once started
	done  chan struct{}          // closed when the process has exited and its logs are read
	err   error                  // Wait's result, valid after done
}

func (p *proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// startKeyline starts the binary on loopback ports chosen by the kernel and
// waits for its "keyline started" line. It is killed when the test ends.
func startKeyline(t testing.TB, dataDir string, extra ...string) *proc {
	t.Helper()
	p := launchKeyline(t, 0, dataDir, extra...)
	p.waitStarted(t, startTimeout)
	return p
}

// startKeylineLimited is startKeyline with the process's open-files limit
// (soft and hard, as `ulimit -n` sets it) at nofile; 0 keeps the test's.
func startKeylineLimited(t testing.TB, nofile int, dataDir string, extra ...string) *proc {
	t.Helper()
	p := launchKeyline(t, nofile, dataDir, extra...)
	p.waitStarted(t, startTimeout)
	return p
}

// launchKeyline starts the binary as startKeyline does without waiting,
// with its open-files limit at nofile (0: the test's).
func launchKeyline(t testing.TB, nofile int, dataDir string, extra ...string) *proc {
	t.Helper()
	return launchBinary(t, keylineBin, nofile, dataDir, extra...)
}

// launchBinary is launchKeyline with another keyline binary (an older
// build, for a benchmark against it).
func launchBinary(t testing.TB, keylineBin string, nofile int, dataDir string, extra ...string) *proc {
	t.Helper()
	args := append([]string{
		"--tcp", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", dataDir, "--log-format", "json",
		"--segment-size", "1MiB", // small segments: every test broker writes one at start
	}, extra...)
	cmd := exec.Command(keylineBin, args...)
	if nofile > 0 {
		// The shell sets the limit and becomes keyline (same pid).
		cmd = exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile), keylineBin}, args...)...)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), ready: make(chan map[string]string, 1)}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs.WriteString(line + "\n")
			p.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "keyline started" {
				addrs := map[string]string{}
				for _, k := range []string{"tcp", "tls", "ws", "wss", "http"} {
					if v, ok := rec[k].(string); ok {
						addrs[k] = v
					}
				}
				p.ready <- addrs
			}
		}
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("keyline logs:\n%s", p.Logs())
		}
	})
	return p
}

// waitStarted waits up to d for the "keyline started" line.
func (p *proc) waitStarted(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case p.addrs = <-p.ready:
	case <-p.done:
		t.Fatalf("keyline exited before it started: %v\n%s", p.err, p.Logs())
	case <-time.After(d):
		t.Fatalf("keyline did not start within %v\n%s", d, p.Logs())
	}
}

// startTimeout bounds the wait for a binary's "keyline started" line. A
// cluster node may itself wait up to nats-start-timeout (30 s) for NATS and
// JetStream (an R3 stream's first leader election: 9 s was seen on a loaded
// machine, past the 10 s mqtttest.Timeout this used); the wait ends at the
// line, so a longer bound only delays the report of a broker that never starts.
const startTimeout = 45 * time.Second

// signal sends sig and waits for the process to exit, returning its exit code.
func (p *proc) signal(t testing.TB, sig syscall.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(2 * mqtttest.Timeout):
		t.Fatalf("keyline still running %v after %v", 2*mqtttest.Timeout, sig)
	}
	return p.cmd.ProcessState.ExitCode()
}

// metric reads one unlabelled metric from /metrics.
func (p *proc) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.addrs["http"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitMetric polls /metrics until name reaches at least want.
func (p *proc) waitMetric(t *testing.T, name string, want float64) {
	t.Helper()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	deadline := time.Now().Add(mqtttest.Timeout)
	for {
		got := p.metric(t, name)
		if got >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %v after %v, want >= %v", name, got, mqtttest.Timeout, want)
		}
		<-poll.C
	}
}
