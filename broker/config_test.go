package broker

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/keyshared"
)

func TestDefaultConfigIsValid(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
}

func TestValidateNamesTheProblem(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no listener", func(c *Config) { c.TCP = "" }, "no MQTT listener"},
		{"bad address", func(c *Config) { c.TCP = "1883" }, `tcp "1883" is not a host:port`},
		{"shared address", func(c *Config) { c.WS = ":1883" }, `tcp and ws both use address ":1883"`},
		{"tls without key", func(c *Config) { c.TLS = ":8883"; c.TLSCert = "c.pem" }, "tls needs both tls-cert and tls-key"},
		{"cert without tls", func(c *Config) { c.TLSCert = "c.pem" }, "tls-cert and tls-key need a tls or wss listener"},
		{"wss without key", func(c *Config) { c.WSS = ":8443"; c.TLSKey = "k.pem" }, "wss needs both tls-cert and tls-key"},
		{"client auth without CA", func(c *Config) { c.TLS = ":8883"; c.TLSCert, c.TLSKey = "c", "k"; c.TLSClientAuth = ClientAuthRequire }, "tls-client-auth require needs tls-client-ca"},
		{"identity without client certificates", func(c *Config) { c.TLS = ":8883"; c.TLSCert, c.TLSKey = "c", "k"; c.TLSIdentity = IdentityCN }, "tls-identity cn needs client certificates"},
		{"crl without CA", func(c *Config) { c.TLS = ":8883"; c.TLSCert, c.TLSKey = "c", "k"; c.TLSCRL = "crl.pem" }, "tls-crl needs tls-client-ca"},
		{"log level", func(c *Config) { c.LogLevel = 0 }, `log-level is not set`},
		{"data dir", func(c *Config) { c.DataDir = "" }, "data-dir is empty"},
		{"max deliveries", func(c *Config) { c.MaxDeliveries = 0 }, "max-deliveries must be at least 1"},
		{"poison policy", func(c *Config) { c.PoisonPolicy = 0 }, `poison-policy is not set`},
		{"slow policy", func(c *Config) { c.SlowPolicy = 0 }, `slow-policy is not set`},
		{"ack timeout", func(c *Config) { c.AckTimeout = 0 }, "ack-timeout must be positive"},
		{"key property", func(c *Config) { c.KeyProperty = "" }, "key-property is empty"},
		{"receive maximum", func(c *Config) { c.ReceiveMaximum = 0 }, "receive-maximum must be at least 1"},
		{"session expiry", func(c *Config) { c.MaxSessionExpiry = -time.Second }, "max-session-expiry"},
		{"keep alive too long", func(c *Config) { c.MaxKeepAlive = 65536 * time.Second }, "max-keep-alive must be whole seconds"},
		{"keep alive not whole seconds", func(c *Config) { c.MaxKeepAlive = 1500 * time.Millisecond }, "max-keep-alive must be whole seconds"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want an ErrInvalidConfig containing %q", err, tc.want)
			}
		})
	}
}

// TestNamedValuesParseOnce: policies and modes parse themselves when the file
// (or a flag) is read, naming the setting and every accepted value.
func TestNamedValuesParseOnce(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"log-level: loud", `log-level "loud" is not one of debug, info, warn or error`},
		{"log-format: xml", `log-format "xml" is not one of text or json`},
		{"poison-policy: retry", `poison-policy "retry" is not one of dead-letter, drop or block`},
		{"backlog-policy: sometimes", `backlog-policy "sometimes" is not one of reject or drop-oldest`},
		{"slow-policy: drop-all", `slow-policy "drop-all" is not one of drop-oldest, drop-newest, disconnect or conflate`},
		{"group-overrides:\n  - share: s\n    poison-policy: later", `poison-policy "later" is not one of`},
		{"conn-queue-overrides:\n  - client-prefix: x\n    slow-policy: slow", `slow-policy "slow" is not one of`},
	} {
		c := DefaultConfig()
		err := DecodeConfig([]byte(tc.yaml), &c)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("DecodeConfig(%q) = %v, want an ErrInvalidConfig containing %q", tc.yaml, err, tc.want)
		}
	}
	c := DefaultConfig()
	if err := DecodeConfig([]byte("log-level: debug\nlog-format: json\npoison-policy: block\nbacklog-policy: drop-oldest\nslow-policy: disconnect\n"), &c); err != nil {
		t.Fatal(err)
	}
	if c.LogLevel != LogDebug || c.LogFormat != LogJSON || c.PoisonPolicy != keyshared.PoisonBlock ||
		c.BacklogPolicy != keyshared.PolicyDropOldest || c.SlowPolicy != connq.Disconnect {
		t.Fatalf("decoded %v %v %v %v %v", c.LogLevel, c.LogFormat, c.PoisonPolicy, c.BacklogPolicy, c.SlowPolicy)
	}
}

func TestDecodeConfig(t *testing.T) {
	c := DefaultConfig()
	err := DecodeConfig([]byte("tcp: 127.0.0.1:1884\nfsync: false\nack-timeout: 45s\nauth:\n  auth:\n    - username: u\n      password: p\n      allow: true\n"), &c)
	if err != nil {
		t.Fatalf("DecodeConfig: %v", err)
	}
	if c.TCP != "127.0.0.1:1884" || c.Fsync || c.AckTimeout != 45*time.Second || c.Auth == nil || len(c.Auth.Auth) != 1 {
		t.Fatalf("decoded %+v", c)
	}
	if c.HTTP != DefaultConfig().HTTP {
		t.Errorf("keys absent from the file must keep their value; http = %q", c.HTTP)
	}

	for name, bad := range map[string]struct{ yaml, want string }{
		"unknown key":   {"tcp: :1883\nlisten: :1884\n", `unknown key "listen"`},
		"wrong type":    {"max-deliveries: lots\n", "cannot unmarshal"},
		"bad duration":  {"ack-timeout: soon\n", "soon"},
		"not a mapping": {"- tcp\n", "cannot unmarshal"},
		"auth typo":     {"auth:\n  users:\n    u:\n      passwd: x\n", `unknown key "passwd"`},
	} {
		c := DefaultConfig()
		if err := DecodeConfig([]byte(bad.yaml), &c); err == nil || !strings.Contains(err.Error(), bad.want) || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: DecodeConfig = %v, want an ErrInvalidConfig mentioning %q", name, err, bad.want)
		}
	}
}

func TestLoadConfigFileErrorsNameTheFile(t *testing.T) {
	c := DefaultConfig()
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	if err := LoadConfigFile(missing, &c); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("tcp: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := LoadConfigFile(bad, &c); err == nil || !strings.HasPrefix(err.Error(), bad+": ") {
		t.Errorf("malformed file: %v", err)
	}
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := LoadConfigFile(empty, &c); err != nil {
		t.Errorf("empty file: %v", err)
	}
}

func TestNewFailsCleanlyOnBadInput(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.TLS, cfg.TLSCert, cfg.TLSKey = "127.0.0.1:0", filepath.Join(dir, "missing.pem"), keyFile
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "missing.pem") {
		t.Errorf("New with a missing certificate = %v", err)
	}

	first := startBroker(t, testConfig(t))
	cfg = testConfig(t)
	cfg.TCP = first.Addr("tcp")
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("New on a port in use = %v", err)
	}
	// The failed New released the data file: a second New on it works.
	cfg.TCP = "127.0.0.1:0"
	b, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("New after a failed New on the same data dir: %v", err)
	}
	if err := b.closeResources(); err != nil {
		t.Fatal(err)
	}
}
