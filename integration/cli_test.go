package integration

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// runKeyline runs the binary to completion and returns its exit code and stderr.
func runKeyline(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(keylineBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("run keyline: %v", err)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

func TestBadInputGivesOneLineAndNonZeroExit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	malformed := write("malformed.yaml", "tcp: [unclosed\n")
	unknownKey := write("unknown.yaml", "tcp: 127.0.0.1:0\nlisten: :1884\n")
	garbageKey := write("garbage-key.pem", "this is not a key")
	cert := write("cert.pem", "this is not a certificate either")

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()

	data := func() string { return filepath.Join(t.TempDir(), "data") }
	// A real data dir, then damaged: its file truncated, or emptied.
	damaged := func(damage func(db string)) string {
		d := data()
		p := startKeyline(t, d)
		if code := p.signal(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("exit %d", code)
		}
		damage(filepath.Join(d, "keyline.db"))
		return d
	}
	truncated := damaged(func(db string) {
		if err := os.Truncate(db, 8192); err != nil {
			t.Fatal(err)
		}
	})
	emptied := damaged(func(db string) {
		if err := os.Truncate(db, 0); err != nil {
			t.Fatal(err)
		}
	})
	// A data dir whose group log holds a message, then its keyline.db removed.
	missing := data()
	{
		p := startKeyline(t, missing)
		w, err := mqtttest.DialWorker(p.addrs["tcp"], "member", mqtttest.WorkerOptions{CleanStart: true})
		if err != nil {
			t.Fatal(err)
		}
		if code, err := w.Subscribe("$share/g/t", 1); err != nil || code > 1 {
			t.Fatalf("subscribe: 0x%02x %v", code, err)
		}
		w.Close()
		pub, err := mqtttest.DialWorker(p.addrs["tcp"], "pub", mqtttest.WorkerOptions{CleanStart: true})
		if err != nil {
			t.Fatal(err)
		}
		if code, err := pub.Publish("t", []byte("kept"), 1); err != nil || code != 0 {
			t.Fatalf("publish: 0x%02x %v", code, err)
		}
		pub.Close()
		if code := p.signal(t, syscall.SIGTERM); code != 0 {
			t.Fatalf("exit %d", code)
		}
		if err := os.Remove(filepath.Join(missing, "keyline.db")); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name     string
		args     []string
		wantCode int
		want     string
	}{
		{"unknown flag", []string{"--no-such-flag"}, 2, "unknown flag: --no-such-flag"},
		{"malformed config", []string{"--config", malformed}, 2, "malformed.yaml"},
		{"unknown config key", []string{"--config", unknownKey}, 2, `unknown key "listen"`},
		{"port in use", []string{"--tcp", busy.Addr().String(), "--http", "", "--data-dir", data()}, 1, "address already in use"},
		{"http port in use", []string{"--tcp", "127.0.0.1:0", "--http", busy.Addr().String(), "--data-dir", data()}, 1, "http listener"},
		{"unreadable TLS key", []string{"--tcp", "127.0.0.1:0", "--http", "", "--data-dir", data(), "--tls", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", dir}, 1, "tls-key " + dir},
		{"garbage TLS key", []string{"--tcp", "127.0.0.1:0", "--http", "", "--data-dir", data(), "--tls", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", garbageKey}, 1, "garbage-key.pem"},
		{"truncated data file", []string{"--tcp", "127.0.0.1:0", "--http", "", "--data-dir", truncated}, 1, "was truncated"},
		{"emptied data file", []string{"--tcp", "127.0.0.1:0", "--http", "", "--data-dir", emptied}, 1, "database file is empty"},
		{"missing data file", []string{"--tcp", "127.0.0.1:0", "--http", "", "--data-dir", missing}, 1, "database file is missing: " + filepath.Join(missing, "keyline.db")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, stderr := runKeyline(t, tc.args...)
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if code != tc.wantCode || len(lines) != 1 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d and one line containing %q", code, stderr, tc.wantCode, tc.want)
			}
			t.Logf("exit %d: %s", code, lines[0])
		})
	}
}

func TestDataDirHeldByAnotherKeyline(t *testing.T) {
	dataDir := t.TempDir()
	startKeyline(t, dataDir)
	code, stderr := runKeyline(t, "--tcp", "127.0.0.1:0", "--http", "", "--data-dir", dataDir)
	if code != 1 || !strings.Contains(stderr, "in use by another process") || strings.Count(stderr, "\n") != 1 {
		t.Fatalf("exit %d, stderr %q; want exit 1 and one line saying the data dir is in use", code, stderr)
	}
}

func TestSigtermShutsDownGracefully(t *testing.T) {
	p := startKeyline(t, t.TempDir())
	if code := p.signal(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if logs := p.Logs(); !strings.Contains(logs, `"msg":"keyline stopped"`) {
		t.Fatalf("no 'keyline stopped' line:\n%s", logs)
	}
}
