package bridge

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseRuleFollowsMosquitto(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Rule
	}{
		{"sensors/#", Rule{Pattern: "sensors/#", Direction: Out}},
		{"sensors/# in", Rule{Pattern: "sensors/#", Direction: In}},
		{"sensors/# both 2", Rule{Pattern: "sensors/#", Direction: Both, QoS: 2}},
		{`# out 1 "" site7/`, Rule{Pattern: "#", Direction: Out, QoS: 1, RemotePrefix: "site7/"}},
		{`# in 1 local/ remote/`, Rule{Pattern: "#", Direction: In, QoS: 1, LocalPrefix: "local/", RemotePrefix: "remote/"}},
		{`"" out 1 a/b/c x/y`, Rule{Direction: Out, QoS: 1, LocalPrefix: "a/b/c", RemotePrefix: "x/y"}},
		{`orders/+ out 1 "" "" ordered`, Rule{Pattern: "orders/+", Direction: Out, QoS: 1, Ordered: true}},
		{"  a/#\tout   1  ", Rule{Pattern: "a/#", Direction: Out, QoS: 1}},
	} {
		got, err := ParseRule(tc.line)
		if err != nil || got != tc.want {
			t.Errorf("ParseRule(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
			continue
		}
		again, err := ParseRule(got.String())
		if err != nil || again != got {
			t.Errorf("ParseRule(%q.String() = %q) = %+v, %v", tc.line, got.String(), again, err)
		}
	}
	for line, want := range map[string]string{
		"":                      "empty topic rule",
		"a/# up":                `direction "up"`,
		"a/# out 3":             "QoS",
		"a/# out 1 x/":          "4 fields",
		`"" out 1 "" x`:         "an empty pattern needs both prefixes",
		"a/# out 1 x/+ y/":      "wildcards",
		"a/#/b":                 "'#' must be the last level",
		`$SYS/# out 0`:          "broker's own",
		`a out 1 "" "" x y z w`: "fields",
		`"unterminated`:         "quoted",
	} {
		if _, err := ParseRule(line); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseRule(%q) = %v, want an error containing %q", line, err, want)
		}
	}
}

func TestRuleMapsTopics(t *testing.T) {
	r := Rule{Pattern: "sensors/#", Direction: Both, LocalPrefix: "edge/", RemotePrefix: "site7/"}
	if got := r.ToRemote("edge/sensors/t1"); got != "site7/sensors/t1" {
		t.Errorf("ToRemote = %q", got)
	}
	if got, ok := r.ToLocal("site7/sensors/t1"); !ok || got != "edge/sensors/t1" {
		t.Errorf("ToLocal = %q %v", got, ok)
	}
	if _, ok := r.ToLocal("other/sensors/t1"); ok {
		t.Error("ToLocal mapped a topic outside the remote prefix")
	}
	if r.LocalFilter() != "edge/sensors/#" || r.RemoteFilter() != "site7/sensors/#" {
		t.Errorf("filters %q %q", r.LocalFilter(), r.RemoteFilter())
	}
}

func TestConfigValidate(t *testing.T) {
	good := func() Config {
		c := DefaultConfig()
		c.Name, c.Addresses, c.ClientID = "cloud", []string{"h:1883"}, "edge-1"
		c.Rules = []Rule{{Pattern: "#", Direction: Both, QoS: 1}}
		return c
	}
	c := good()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Backlog.MaxBytes != DefaultBacklogBytes || c.Backlog.Policy.String() != "drop-oldest" {
		t.Fatalf("default backlog %+v: want bounded at 1 GiB, drop-oldest", c.Backlog)
	}
	for want, mod := range map[string]func(*Config){
		"bridge name":          func(c *Config) { c.Name = "a b" },
		"no addresses":         func(c *Config) { c.Addresses = nil },
		"not host:port":        func(c *Config) { c.Addresses = []string{"h"} },
		"client-id":            func(c *Config) { c.ClientID = "" },
		"protocol":             func(c *Config) { c.Protocol = 3 },
		"keep-alive":           func(c *Config) { c.KeepAlive = 500 * time.Millisecond },
		"reconnect-backoff":    func(c *Config) { c.ReconnectMax = c.ReconnectMin / 2 },
		"max-inflight":         func(c *Config) { c.MaxInflight = 70000 },
		"no topic rules":       func(c *Config) { c.Rules = nil },
		"topics[0]":            func(c *Config) { c.Rules[0].QoS = 3 },
		"session-expiry":       func(c *Config) { c.SessionExpiry = -time.Second },
		"max-deliveries":       func(c *Config) { c.MaxDeliveries = -1 },
		"backlog":              func(c *Config) { c.Backlog.Policy = 9 },
		"username and passwor": func(c *Config) { c.Password = strings.Repeat("p", 70000) },
	} {
		c := good()
		mod(&c)
		err := c.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
	if err := ValidateAll([]Config{good(), good()}); err == nil || !strings.Contains(err.Error(), "two bridges") {
		t.Errorf("two bridges of one name: %v", err)
	}
}

func TestBackoffDoublesWithJitter(t *testing.T) {
	for n := 1; n <= 10; n++ {
		want := time.Second << (n - 1)
		if want > 6*time.Second {
			want = 6 * time.Second // the cap, not the next doubling (8 s)
		}
		for range 50 {
			d := backoff(time.Second, 6*time.Second, n)
			if d < want/2 || d > want {
				t.Fatalf("attempt %d: %v, want within [%v, %v]", n, d, want/2, want)
			}
		}
	}
}

func TestSplitFields(t *testing.T) {
	got, err := SplitFields(`a  "b c" d="e f" "" g"\t"`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "b c", "d=e f", "", "g\t"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("SplitFields = %q, want %q", got, want)
	}
}

// FuzzParseRule: whatever the line, ParseRule does not panic, and what it
// accepts is valid and prints back to itself.
func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"#", `a/# out 1 "" b/`, "x in 2 l/ r/ ordered", `"" both 0 a b`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err != nil {
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("ParseRule(%q) accepted an invalid rule: %v", s, err)
		}
		again, err := ParseRule(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRule(%q) = %+v prints as %q, which parses as %+v, %v", s, r, r.String(), again, err)
		}
	})
}

func TestLocalTopicOK(t *testing.T) {
	for topic, want := range map[string]bool{
		"cmd/1": true, "a": true, "": false, "$SYS/broker/x": false, "$dlq/g/t": false, "a/+/b": false, "a/#": false,
		"a\x00b": false, "\xff": false, strings.Repeat("x", 65536): false,
	} {
		if got := localTopicOK(topic); got != want {
			t.Errorf("localTopicOK(%q) = %v, want %v", clipTopic(topic), got, want)
		}
	}
}
