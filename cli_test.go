package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/broker"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// startTestBroker runs an in-process broker on loopback ports the kernel picks.
func startTestBroker(t *testing.T, token string) *broker.Broker {
	return startTestBrokerWith(t, func(cfg *broker.Config) {
		cfg.HTTPToken = token
		cfg.MaxDeliveries, cfg.AckTimeout = 1, 200*time.Millisecond
	})
}

// startTestBrokerWith is startTestBroker with its config changed by mod.
func startTestBrokerWith(t *testing.T, mod func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.DefaultConfig()
	cfg.TCP, cfg.HTTP, cfg.DataDir, cfg.Fsync, cfg.SegmentSize = "127.0.0.1:0", "127.0.0.1:0", t.TempDir(), false, 1<<20
	mod(&cfg)
	b, err := broker.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return b
}

// keyline runs the command line and returns exit code, stdout and stderr.
func keyline(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// wantFail checks a failed run: exit code, and one stderr line "keyline: ..." containing want.
func wantFail(t *testing.T, code int, stderr string, wantCode int, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if code != wantCode || len(lines) != 1 || !strings.HasPrefix(lines[0], "keyline: ") || !strings.Contains(lines[0], want) {
		t.Errorf("exit %d, stderr %q; want exit %d and one line containing %q", code, stderr, wantCode, want)
	}
}

// deadLetter makes one dead letter in group: a member that never acks
// receives a message, and with max-deliveries 1 its ack timeout kills it.
func deadLetter(t *testing.T, b *broker.Broker, group, topic, key, payload string) {
	t.Helper()
	addr := b.Addr("tcp")
	got := make(chan struct{}, 1)
	c := paho.NewClient(paho.ClientConfig{
		ClientID: "silent", Conn: mqtttest.Dial(t, mqtttest.TCP, addr, nil), EnableManualAcknowledgment: true,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(paho.PublishReceived) (bool, error) {
			got <- struct{}{}
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
	defer cancel()
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: "silent", CleanStart: true, KeepAlive: 30}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.Disconnect(&paho.Disconnect{})
		<-c.Done()
	}()
	filter := "$share/" + group
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		t.Fatal(err)
	}
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub-" + key, CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload), Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
	select {
	case <-got:
	case <-ctx.Done():
		t.Fatal("the silent member got nothing")
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		code, out, _ := keyline(t, "dlq", "list", group, "--server", b.Addr("http"), "--json")
		var p adminapi.DeadLetterPage
		if code == 0 && json.Unmarshal([]byte(out), &p) == nil && len(p.DeadLetters) > 0 && p.DeadLetters[len(p.DeadLetters)-1].Key == key {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("no dead letter for key %s", key)
		}
	}
	if _, err := c.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{filter}}); err != nil {
		t.Fatal(err)
	}
}

func TestCLIGroupsAndDeadLetters(t *testing.T) {
	t.Setenv("KEYLINE_HTTP_TOKEN", "")
	b := startTestBroker(t, "")
	server := "http://" + b.Addr("http")
	const group = "workers/orders/#"

	code, out, stderr := keyline(t, "groups", "list", "--server", server)
	if code != 0 || out != "no groups\n" {
		t.Fatalf("groups list = %d %q %q", code, out, stderr)
	}

	deadLetter(t, b, group, "orders/1", "k1", "hello")
	deadLetter(t, b, group, "orders/2", "k2", "world")
	member := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil), &paho.Connect{ClientID: "worker-1", CleanStart: true, KeepAlive: 30})
	member.Subscribe(t, paho.SubscribeOptions{Topic: "$share/" + group, QoS: 1})

	code, out, stderr = keyline(t, "groups", "--server", b.Addr("http")) // list is the default; the scheme is optional
	if code != 0 || !strings.Contains(out, "GROUP") || !strings.Contains(out, group) || !strings.Contains(out, "DEAD-LETTERS") {
		t.Fatalf("groups = %d %q %q", code, out, stderr)
	}
	code, out, _ = keyline(t, "groups", "list", "--json", "--server", server)
	var list struct{ Groups []adminapi.GroupView }
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list.Groups) != 1 || list.Groups[0].DeadLetters != 2 {
		t.Fatalf("groups list --json = %d %v %q", code, err, out)
	}

	code, out, stderr = keyline(t, "groups", "show", group, "--server", server)
	if code != 0 || !strings.Contains(out, "worker-1") || !strings.Contains(out, "dead letters:") || !strings.Contains(out, "max-deliveries 1") {
		t.Fatalf("groups show = %d %q %q", code, out, stderr)
	}

	code, _, stderr = keyline(t, "groups", "delete", group, "--server", server)
	wantFail(t, code, stderr, 1, "has 1 member (worker-1)")

	code, out, stderr = keyline(t, "dlq", "list", group, "--server", server, "--limit", "1")
	if code != 0 || !strings.Contains(out, "k1") || strings.Contains(out, "k2") || !strings.Contains(out, `"hello"`) || !strings.Contains(out, "more with --after 1") {
		t.Fatalf("dlq list --limit 1 = %d %q %q", code, out, stderr)
	}
	code, out, _ = keyline(t, "dlq", "list", group, "--server", server, "--after", "1")
	if code != 0 || !strings.Contains(out, "k2") || strings.Contains(out, "k1") {
		t.Fatalf("dlq list --after 1 = %d %q", code, out)
	}
	code, out, stderr = keyline(t, "dlq", "show", group, "--id", "2", "--server", server)
	if code != 0 || !strings.Contains(out, "k2") || !strings.Contains(out, "\nworld\n") {
		t.Fatalf("dlq show --id 2 = %d %q %q", code, out, stderr)
	}
	code, _, stderr = keyline(t, "dlq", "show", group, "--server", server)
	wantFail(t, code, stderr, 2, "needs --id")

	code, out, stderr = keyline(t, "dlq", "replay", group, "--id", "1", "--server", server)
	if code != 0 || !strings.Contains(out, "replayed 1 dead letter of "+group) {
		t.Fatalf("dlq replay --id 1 = %d %q %q", code, out, stderr)
	}
	if m := member.Next(t); string(m.Payload) != "hello" {
		t.Errorf("replayed %q, want hello", m.Payload)
	}
	code, _, stderr = keyline(t, "dlq", "replay", group, "--id", "1", "--server", server)
	wantFail(t, code, stderr, 1, "no dead letter with id 1 (HTTP 404)")

	code, _, stderr = keyline(t, "dlq", "purge", group, "--server", server)
	wantFail(t, code, stderr, 2, "--all")
	code, out, stderr = keyline(t, "dlq", "purge", group, "--all", "--server", server)
	if code != 0 || out != "purged 1 dead letter of "+group+"\n" {
		t.Fatalf("dlq purge --all = %d %q %q", code, out, stderr)
	}
	code, out, _ = keyline(t, "dlq", "list", group, "--server", server)
	if code != 0 || !strings.Contains(out, "no dead letters") {
		t.Fatalf("dlq list after purge = %d %q", code, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
	defer cancel()
	if _, err := member.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{"$share/" + group}}); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = keyline(t, "groups", "delete", "$share/"+group, "--server", server)
	if code != 0 || !strings.Contains(out, "deleted group "+group) {
		t.Fatalf("groups delete = %d %q %q", code, out, stderr)
	}
	code, _, stderr = keyline(t, "groups", "show", group, "--server", server)
	wantFail(t, code, stderr, 1, `no group "workers/orders/#" (HTTP 404)`)
}

func TestCLIErrors(t *testing.T) {
	t.Setenv("KEYLINE_HTTP_TOKEN", "")
	b := startTestBroker(t, "tok")
	server := b.Addr("http")

	code, _, stderr := keyline(t, "groups", "list", "--server", server)
	wantFail(t, code, stderr, 1, "needs a token: pass --token or set KEYLINE_HTTP_TOKEN (HTTP 401)")
	code, _, stderr = keyline(t, "groups", "list", "--server", server, "--token", "nope")
	wantFail(t, code, stderr, 1, "wrong bearer token (HTTP 401)")
	if code, out, stderr := keyline(t, "groups", "list", "--server", server, "--token", "tok"); code != 0 || out != "no groups\n" {
		t.Errorf("with --token: %d %q %q", code, out, stderr)
	}
	t.Setenv("KEYLINE_HTTP_TOKEN", "tok")
	if code, out, stderr := keyline(t, "dlq", "list", "a/b", "--server", server); code != 1 || !strings.Contains(stderr, `no group "a/b"`) {
		t.Errorf("with $KEYLINE_HTTP_TOKEN: %d %q %q", code, out, stderr)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"groups", "frob"}, `unknown command "groups frob"`},
		{[]string{"groups", "show"}, "needs a GROUP"},
		{[]string{"groups", "show", "a/b", "c/d"}, `unexpected argument "c/d"`},
		{[]string{"groups", "list", "--id", "3"}, "--id does not apply"},
		{[]string{"dlq"}, "dlq needs list, show, replay or purge"},
		{[]string{"dlq", "list"}, "needs a GROUP"},
		{[]string{"dlq", "list", "a/b", "--limit", "x"}, `invalid argument "x" for "--limit"`},
		{[]string{"dlq", "list", "a/b", "--limit", "0"}, "--limit 0"},
		{[]string{"dlq", "replay", "a/b", "--id", "1", "--all"}, "not both"},
		{[]string{"dlq", "list", "a/b", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"dlq", "list", "a/b", "--server", "ftp://x"}, "--server"},
	} {
		code, _, stderr := keyline(t, tc.args...)
		wantFail(t, code, stderr, 2, tc.want)
	}

	code, _, stderr = keyline(t, "groups", "--server", "127.0.0.1:1")
	wantFail(t, code, stderr, 1, "cannot reach the broker at http://127.0.0.1:1")

	code, out, _ := keyline(t, "dlq", "--help")
	if code != 0 || !strings.Contains(out, "keyline dlq replay GROUP") || !strings.Contains(out, "--server") {
		t.Errorf("dlq --help = %d %q", code, out)
	}
	code, out, _ = keyline(t, "--help")
	if code != 0 || !strings.Contains(out, "keyline groups") || !strings.Contains(out, "keyline dlq") {
		t.Errorf("--help does not mention the admin subcommands: %q", out)
	}
}

// TestCLIEscapesWhatClientsSent: names, keys and topics come from clients; a
// terminal escape sequence in one is printed quoted, never raw.
func TestCLIEscapesWhatClientsSent(t *testing.T) {
	t.Setenv("KEYLINE_HTTP_TOKEN", "")
	b := startTestBroker(t, "")
	server := "http://" + b.Addr("http")
	const group = "evil\x1b]0;owned\x07/orders/#"
	deadLetter(t, b, group, "orders/\x1b[2J", "\x1b[31mred\x1b[0m", "payload\x1b[5m")
	for _, args := range [][]string{
		{"groups", "list"}, {"groups", "show", group}, {"dlq", "list", group},
	} {
		code, out, stderr := keyline(t, append(args, "--server", server)...)
		if code != 0 {
			t.Fatalf("%v: %d %s", args, code, stderr)
		}
		if strings.ContainsAny(out, "\x1b\x07") {
			t.Fatalf("%v printed a raw control character:\n%q", args, out)
		}
		if !strings.Contains(out, `\x1b`) {
			t.Fatalf("%v: the escaped sequence is missing:\n%s", args, out)
		}
	}
}

func TestTermQuotesControlCharacters(t *testing.T) {
	for in, want := range map[string]string{
		"plain/topic": "plain/topic", "tab\there": "tab\there", "ü/ñ": "ü/ñ",
		"\x1b[2J": `\x1b[2J`, "bell\x07": `bell\a`, "nul\x00": `nul\x00`, "\xff": `\xff`, "del\x7f": `del\x7f`,
	} {
		if got := term(in); got != want {
			t.Errorf("term(%q) = %q, want %q", in, got, want)
		}
	}
}
