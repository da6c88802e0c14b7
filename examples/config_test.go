package examples_test

import (
	"testing"
	"time"

	"github.com/keyline-mq/keyline/broker"
)

// TestSampleConfigLoads keeps keyline.yaml in step with the broker's config:
// every key known, every value valid, the overrides and the ledger read.
func TestSampleConfigLoads(t *testing.T) {
	cfg := broker.DefaultConfig()
	if err := broker.LoadConfigFile("keyline.yaml", &cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	switch {
	case len(cfg.ConnQueueOverrides) != 2 || cfg.ConnQueueOverrides[1].SlowPolicy.String() != "disconnect":
		t.Errorf("conn-queue-overrides: %+v", cfg.ConnQueueOverrides)
	case len(cfg.GroupOverrides) != 2 || cfg.GroupOverrides[0].MaxDeliveries != 3 || cfg.GroupOverrides[1].PoisonPolicy.String() != "block":
		t.Errorf("group-overrides: %+v", cfg.GroupOverrides)
	case len(cfg.RetryBackoff) != 2 || cfg.RetryBackoff[1] != time.Minute:
		t.Errorf("retry-backoff: %v", cfg.RetryBackoff)
	case cfg.Auth == nil || len(cfg.Auth.Auth) != 3 || len(cfg.Auth.ACL) != 3:
		t.Errorf("auth: %+v", cfg.Auth)
	}
}

// TestBridgeConfigLoads keeps bridge.yaml (README "Bridges") valid.
func TestBridgeConfigLoads(t *testing.T) {
	cfg := broker.DefaultConfig()
	if err := broker.LoadConfigFile("bridge.yaml", &cfg); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Bridges) != 1 || len(cfg.Bridges[0].Topics) != 4 || !cfg.Bridges[0].Topics[3].Ordered || cfg.Bridges[0].BacklogMaxBytes != 256<<20 {
		t.Errorf("bridges: %+v", cfg.Bridges)
	}
}
