package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

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
