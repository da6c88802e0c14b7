package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/broker"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/poll"
)

func TestBridgeFlagParsesLikeTheConfigFile(t *testing.T) {
	cfg, _, err := parseArgs([]string{"--bridge", `name=cloud address=a:1883 address=b:1883 protocol=5 keep-alive=20s clean-start=true reconnect-backoff=100ms,2s topic="sensors/# out 1 \"\" site/" topic="cmd/# in 2 site/cmd/ \"\" ordered" backlog-max-bytes=64MiB`})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Bridges) != 1 {
		t.Fatalf("bridges %+v", cfg.Bridges)
	}
	b := cfg.Bridges[0]
	switch {
	case b.Name != "cloud" || strings.Join(b.Addresses, ",") != "a:1883,b:1883" || b.Protocol != "5" || !b.CleanStart:
		t.Fatalf("bridge %+v", b)
	case b.KeepAlive == nil || *b.KeepAlive != 20*time.Second || len(b.ReconnectBackoff) != 2 || b.BacklogMaxBytes != 64<<20:
		t.Fatalf("durations and sizes %+v", b)
	case len(b.Topics) != 2 || b.Topics[0].String() != `sensors/# out 1 "" site/` || b.Topics[1].String() != `cmd/# in 2 site/cmd/ "" ordered`:
		t.Fatalf("topics %v", b.Topics)
	}
	for _, tc := range []struct{ arg, want string }{
		{"name=x", "no addresses"},
		{"name=x address=h:1 client-id=c topic=\"a/# sideways\"", `direction "sideways"`},
		{"name=x address=h:1 client-id=c topic=a/# colour=red", `unknown key "colour"`},
		{"name=x address=h:1 client-id=c", "no topic rules"},
		{"name=x address=nohost client-id=c topic=a", "not host:port"},
		{"name=bad.name address=h:1 client-id=c topic=a", "bridge name"},
	} {
		_, _, err := parseArgs([]string{"--bridge", tc.arg})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--bridge %s: %v, want an error containing %q", tc.arg, err, tc.want)
		}
	}
}

func TestBridgesCommand(t *testing.T) {
	remote := startTestBroker(t, "")
	bc, err := broker.ParseBridgeFlag(`name=up client-id=edge-1 address=` + remote.Addr("tcp") + ` topic="sensors/# out 1 \"\" site1/"`)
	if err != nil {
		t.Fatal(err)
	}
	edge := startTestBrokerWith(t, func(cfg *broker.Config) { cfg.Bridges = []broker.BridgeConfig{bc} })
	server := "http://" + edge.Addr("http")
	deadline := time.Now().Add(mqtttest.Timeout)
	var code int
	var out string
	if !poll.Within(time.Until(deadline), func() bool { // the broker's bridge state
		code, out, _ = keyline(t, "bridges", "--server", server, "--json")
		var v adminapi.BridgeList
		return code == 0 && json.Unmarshal([]byte(out), &v) == nil && len(v.Bridges) == 1 && v.Bridges[0].State == "connected"
	}) {
		t.Fatalf("bridges --json: exit %d, %s", code, out)
	}
	code, out, stderr := keyline(t, "bridges", "--server", server)
	if code != 0 || !strings.Contains(out, "BRIDGE") || !strings.Contains(out, "up") || !strings.Contains(out, "connected") {
		t.Fatalf("bridges: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = keyline(t, "bridges", "show", "up", "--server", server)
	if code != 0 || !strings.Contains(out, `sensors/# out 1 "" site1/`) || !strings.Contains(out, "edge-1") || !strings.Contains(out, "$keyline.bridge.up/sensors/#") {
		t.Fatalf("bridges show: exit %d\n%s%s", code, out, stderr)
	}
	code, _, stderr = keyline(t, "bridges", "show", "nope", "--server", server)
	wantFail(t, code, stderr, 1, `no bridge named "nope"`)
	code, _, stderr = keyline(t, "bridges", "show", "--server", server)
	wantFail(t, code, stderr, 2, "bridges show needs a NAME")
}

func TestBridgeFlagSections(t *testing.T) {
	bc, err := broker.ParseBridgeFlag(`name=x address=h:1 client-id=c topic=a tls.server-name=central tls.insecure-skip-verify=true`)
	if err != nil {
		t.Fatal(err)
	}
	if bc.TLS == nil || bc.TLS.ServerName != "central" || !bc.TLS.InsecureSkipVerify {
		t.Fatalf("tls %+v", bc.TLS)
	}
	if _, err := broker.ParseBridgeFlag(`name=x address=h:1 client-id=c topic=a tls.colour=red`); err == nil || !strings.Contains(err.Error(), `unknown key "colour"`) {
		t.Fatalf("an unknown key in a section: %v", err)
	}
}
