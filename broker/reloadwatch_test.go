package broker

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/poll"
)

// TestReloadWatch: with reload-watch, editing the password file or the
// config file reloads without a signal: a removed user is cut off, a
// broken file changes nothing (counted as a failed reload), and a changed
// ACL in the config file applies.
func TestReloadWatch(t *testing.T) {
	dir := t.TempDir()
	pwFile, cfgFile := filepath.Join(dir, "passwd"), filepath.Join(dir, "keyline.yaml")
	aliceHash := hashOf(t, "apw")
	writePasswd(t, pwFile, map[string]string{"alice": aliceHash, "bob": hashOf(t, "bpw")})
	writeACL := func(access int) {
		t.Helper()
		y := "auth:\n  acl:\n    - username: alice\n      filters:\n        \"news/#\": " + string(rune('0'+access)) + "\n"
		if err := os.WriteFile(cfgFile, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeACL(3)
	cfg := testConfig(t)
	cfg.PasswordFile, cfg.ConfigFile, cfg.ReloadWatch = pwFile, cfgFile, 100*time.Millisecond
	source := func() (Config, error) {
		c := cfg
		return c, LoadConfigFile(cfgFile, &c)
	}
	b, _, alice, bob := startReloadable(t, source)

	// bob leaves the password file: the watch reloads and cuts him off.
	writePasswd(t, pwFile, map[string]string{"alice": aliceHash})
	poll.Until(t, mqtttest.Timeout, "a reload after the password file changed", func() bool { return b.reload.ok.Load() == 1 })
	select {
	case <-bob.Done():
	case <-time.After(mqtttest.Timeout):
		t.Fatal("bob is still connected after leaving the password file")
	}

	// A broken password file: a failed reload, alice keeps her connection.
	if err := os.WriteFile(pwFile, []byte("alice:"+aliceHash+"\nno colon\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, mqtttest.Timeout, "a failed reload after the broken write", func() bool { return b.reload.bad.Load() == 1 })
	if rc := alice.Publish(t, &paho.Publish{Topic: "news/a", QoS: 1, Payload: []byte("1")}); rc != 0 {
		t.Fatalf("alice after the failed reload: %#x", rc)
	}

	// Fixed, and the config file's ACL makes news/# read-only for alice.
	writePasswd(t, pwFile, map[string]string{"alice": aliceHash})
	writeACL(1)
	poll.Until(t, mqtttest.Timeout, "a reload after the config file changed", func() bool { return b.reload.ok.Load() >= 2 })
	poll.Until(t, mqtttest.Timeout, "alice's publish refused by the new ACL", func() bool {
		return alice.Publish(t, &paho.Publish{Topic: "news/a", QoS: 1, Payload: []byte("2")}) == 0x87
	})
}
