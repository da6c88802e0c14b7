package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/broker"
)

func TestFlagsOverrideConfigFileOverDefaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keyline.yaml")
	if err := os.WriteFile(path, []byte("tcp: 127.0.0.1:2883\nhttp: 127.0.0.1:2884\nack-timeout: 1m\nlog-format: json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, act, err := parseArgs([]string{"--config", path, "--tcp", "127.0.0.1:3883", "--max-deliveries=9"})
	if err != nil || act != actionRun {
		t.Fatalf("parseArgs: %v %v", act, err)
	}
	if cfg.TCP != "127.0.0.1:3883" {
		t.Errorf("tcp = %q: the flag must win over the file", cfg.TCP)
	}
	if cfg.HTTP != "127.0.0.1:2884" || cfg.AckTimeout != time.Minute || cfg.LogFormat != broker.LogJSON {
		t.Errorf("file values lost: http %q ack-timeout %v log-format %q", cfg.HTTP, cfg.AckTimeout, cfg.LogFormat)
	}
	if cfg.MaxDeliveries != 9 {
		t.Errorf("max-deliveries = %d, want 9 from the flag", cfg.MaxDeliveries)
	}
	if cfg.DataDir != "./data" {
		t.Errorf("data-dir = %q, want the default", cfg.DataDir)
	}
}

func TestCommandLineErrorsAreOneLineAndExit2(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("tcp: :1883\nlisten: :1884\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"--max-deliveries", "many"}, `invalid argument "many" for "--max-deliveries"`},
		{[]string{"serve"}, `unexpected argument "serve"`},
		{[]string{"--config", bad}, `unknown key "listen"`},
		{[]string{"--config", filepath.Join(dir, "missing.yaml")}, "missing.yaml"},
		{[]string{"--log-level", "loud"}, `log-level "loud"`},
		{[]string{"--tls", ":8883"}, "tls needs both tls-cert and tls-key"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
		if code != 2 || len(lines) != 1 || !strings.Contains(lines[0], tc.want) || !strings.HasPrefix(lines[0], "keyline: ") {
			t.Errorf("keyline %s: exit %d, stderr %q; want exit 2 and one line containing %q", strings.Join(tc.args, " "), code, stderr.String(), tc.want)
		}
	}
}

func TestHelpGroupsEveryFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("--help exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"Listeners:", "Storage:", "Logs:", "Key-Shared groups",
		"--tcp string", `(default ":1883")`, "--ws string", "--tls string", "--tls-cert", "--tls-key",
		"--http string", `(default "127.0.0.1:9883")`, "--data-dir string", `(default "./data")`,
		"--config", "--log-level", "--log-format", "--key-property", "--ack-timeout", "--max-deliveries", "--poison-policy", "--fsync",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

func TestClusterFlagsAndConfigKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keyline.yaml")
	yaml := "nats: [nats://10.0.0.1:4222, nats://10.0.0.2:4222]\nnode-id: from-file\nnats-replicas: 1\nnats-queue-max-age: 2h\nnats-queue-max-bytes: 64MiB\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, _, err := parseArgs([]string{"--config", path, "--node-id", "n1", "--nats-creds", "/etc/nats.creds"})
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Cluster
	if !slices.Equal(c.NATS, []string{"nats://10.0.0.1:4222", "nats://10.0.0.2:4222"}) || c.NodeID != "n1" || c.NATSReplicas != 1 ||
		c.QueueMaxAge != 2*time.Hour || c.QueueMaxBytes != 64<<20 || c.NATSCreds != "/etc/nats.creds" {
		t.Fatalf("cluster config %+v", c)
	}
	cfg, _, err = parseArgs([]string{"--nats", "nats://a:4222,nats://b:4222", "--nats-replicas", "5"})
	if err != nil || len(cfg.Cluster.NATS) != 2 || cfg.Cluster.NATSReplicas != 5 {
		t.Fatalf("flags: %+v %v", cfg.Cluster, err)
	}
	for _, bad := range [][]string{
		{"--nats", "nats://a:4222", "--nats-replicas", "0"},
		{"--nats", "nats://a:4222", "--nats-tls-cert", "c.pem"},
		{"--nats", "nats://a:4222", "--node-id", "has space"},
	} {
		if _, _, err := parseArgs(bad); err == nil {
			t.Errorf("parseArgs(%q) accepted", bad)
		}
	}
	if _, _, err := parseArgs([]string{"--nats-replicas", "0"}); err != nil {
		t.Errorf("cluster settings without --nats are not checked: %v", err)
	}
}
