package integration

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// secureConfig is a multi-tenant config file as an operator writes it: users
// with passwords, per-user ACLs, and a last rule that denies everything else.
const secureConfig = `
auth:
  users:
    admin:
      password: admin-pw
      acl:
        "admin/#": 3
        "$dlq/#": 1
    evil:
      password: evil-pw
      acl:
        "admin/#": 0
        "#": 3
    ops:
      password: ops-pw
      acl:
        "$dlq/#": 1
        "#": 1
    billing:
      password: billing-pw
      acl:
        "orders/#": 3
        "$share/billing/#": 1
    intruder:
      password: intruder-pw
      acl:
        "$share/billing/#": 0
        "orders/#": 3
    greedy:
      password: greedy-pw
      acl:
        "#": 3
        "secret/#": 0
    device:
      password: device-pw
  acl:
    - username: device
      filters:
        "sensors/#": 3
    - filters:
        "#": 0
`

// startSecure starts keyline with secureConfig (plus extra settings).
func startSecure(t *testing.T, extraYAML string, args ...string) *proc {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "keyline.yaml")
	if err := os.WriteFile(path, []byte(secureConfig+extraYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	return startKeyline(t, filepath.Join(dir, "data"), append([]string{"--config", path}, args...)...)
}

func dialAs(t *testing.T, addr, id, user string, o mqtttest.WorkerOptions) *mqtttest.Worker {
	t.Helper()
	o.Username, o.Password = user, user+"-pw"
	if o.KeepAlive == 0 {
		o.KeepAlive = 30
	}
	w, err := mqtttest.DialWorker(addr, id, o)
	if err != nil {
		t.Fatalf("%s as %s: %v", id, user, err)
	}
	t.Cleanup(func() { _ = w.Disconnect() })
	return w
}

func subscribe(t *testing.T, w *mqtttest.Worker, filter string, want byte) {
	t.Helper()
	code, err := w.Subscribe(filter, 1)
	if err != nil || code != want {
		t.Fatalf("%s subscribing to %q: code 0x%02x, %v; want 0x%02x", w.ClientID, filter, code, err, want)
	}
}

// TestDeadLettersNeverLeak: a member that may not read a message's topic is
// not eligible for it (the message waits; it is not dead-lettered to where
// that member could read it), and $dlq/... needs a filter that names it.
func TestDeadLettersNeverLeak(t *testing.T) {
	p := startSecure(t, "")
	addr := p.addrs["tcp"]
	evil := dialAs(t, addr, "evil-1", "evil", mqtttest.WorkerOptions{CleanStart: true})
	subscribe(t, evil, "$share/evil/+/secret", 1) // +/secret is not covered by evil's deny rule
	subscribe(t, evil, "$dlq/#", 0x87)            // no filter of evil's names $dlq
	ops := dialAs(t, addr, "ops-1", "ops", mqtttest.WorkerOptions{CleanStart: true})
	subscribe(t, ops, "$dlq/#", 1)
	admin := dialAs(t, addr, "admin-1", "admin", mqtttest.WorkerOptions{CleanStart: true})
	if code, err := admin.Publish("admin/secret", []byte("the plans"), 1); err != nil || code != 0 {
		t.Fatalf("admin publish: 0x%02x %v", code, err)
	}
	v := waitGroup(t, p, "evil/+/secret", "the message waiting for an eligible member", func(v adminapi.GroupView) bool {
		return v.Head == 1 && v.UnroutableKeys == 1
	})
	if v.DeadLetters != 0 || v.Counters.Delivered != 0 {
		t.Fatalf("group %+v: the message must wait, neither delivered nor dead-lettered", v)
	}
	for _, w := range []*mqtttest.Worker{evil, ops} {
		if m := w.Next(300 * time.Millisecond); m != nil {
			t.Fatalf("%s received %q on %s", w.ClientID, m.Payload, m.Topic)
		}
	}
}

// TestNoPublishingIntoReservedTopics: $dlq/, $share/ and $SYS/ are the
// broker's: MQTT 5 publishers get 0x87, 3.1.1 ones are disconnected, QoS 0
// publishes are dropped and counted. With or without auth.
func TestNoPublishingIntoReservedTopics(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "no auth", true: "auth"}[secure], func(t *testing.T) {
			var p *proc
			user := ""
			if secure {
				p, user = startSecure(t, ""), "admin"
			} else {
				p = startKeyline(t, t.TempDir())
			}
			addr := p.addrs["tcp"]
			watcher := dialAs(t, addr, "watch", map[bool]string{false: "", true: "ops"}[secure], mqtttest.WorkerOptions{CleanStart: true})
			subscribe(t, watcher, "$dlq/#", 1)
			pub := dialAs(t, addr, "forger", user, mqtttest.WorkerOptions{CleanStart: true})
			for _, topic := range []string{"$dlq/billing/orders/1", "$share/billing/orders/1", "$SYS/broker/uptime", "$DLQ/x"} {
				code, err := pub.PublishMessage(mqtttest.Outgoing{Topic: topic, Payload: []byte("forged"), QoS: 1,
					User: []mqtttest.UserProperty{{Key: "dlq-group", Value: "billing/orders/#"}}})
				if err != nil || code != 0x87 {
					t.Fatalf("QoS 1 publish to %s: 0x%02x, %v; want 0x87", topic, code, err)
				}
				if _, err := pub.Publish(topic, []byte("forged"), 0); err != nil {
					t.Fatal(err)
				}
			}
			// A QoS 1 round trip after the QoS 0 publishes: they were read (and dropped).
			if code, err := pub.Publish("admin/ok", []byte("x"), 1); err != nil || code != 0 {
				t.Fatalf("ordinary publish: 0x%02x %v", code, err)
			}
			if m := watcher.Next(300 * time.Millisecond); m != nil {
				t.Fatalf("a forged dead letter reached $dlq/#: %s %q", m.Topic, m.Payload)
			}
			if n := p.metric(t, "keyline_reserved_publishes_refused_total"); n != 8 {
				t.Fatalf("refused reserved publishes counted %v, want 8", n)
			}
			// MQTT 3.1.1 cannot refuse a publish: the publisher is disconnected.
			v3, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer v3.Close()
			connectV3(t, v3, "v3-forger", map[bool]string{false: "", true: "admin"}[secure])
			if _, err := v3.Write(v3Publish("$dlq/billing/x", 1, []byte("forged"))); err != nil {
				t.Fatal(err)
			}
			if err := readUntilClosed(v3); err != nil {
				t.Fatalf("3.1.1 publisher into $dlq: %v", err)
			}
		})
	}
}

// connectV3 sends an MQTT 3.1.1 CONNECT (clean session) and reads CONNACK.
func connectV3(t *testing.T, c net.Conn, id, user string) {
	t.Helper()
	var vh []byte
	vh = append(vh, 0, 4, 'M', 'Q', 'T', 'T', 4)
	flags := byte(0x02)
	if user != "" {
		flags |= 0xC0
	}
	vh = append(vh, flags, 0, 30)
	vh = appendStr(vh, id)
	if user != "" {
		vh = appendStr(vh, user)
		vh = appendStr(vh, user+"-pw")
	}
	if _, err := c.Write(append([]byte{0x10, byte(len(vh))}, vh...)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	if _, err := c.Read(buf); err != nil || buf[0] != 0x20 || buf[3] != 0 {
		t.Fatalf("CONNACK %x, %v", buf, err)
	}
}

func appendStr(b []byte, s string) []byte {
	return append(append(b, byte(len(s)>>8), byte(len(s))), s...)
}

func v3Publish(topic string, qos byte, payload []byte) []byte {
	body := appendStr(nil, topic)
	if qos > 0 {
		body = append(body, 0, 1)
	}
	body = append(body, payload...)
	return append([]byte{0x30 | qos<<1, byte(len(body))}, body...)
}

// readUntilClosed reads until the broker closes the connection; an
// acknowledgement before that is an error.
func readUntilClosed(c net.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	buf := make([]byte, 64)
	for {
		n, err := c.Read(buf)
		if n > 0 && buf[0]>>4 == 4 {
			return fmt.Errorf("got a PUBACK %x instead of a disconnect", buf[:n])
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return errors.New("still connected")
			}
			return nil
		}
	}
}

// TestClientIDBelongsToItsUser: another user's CONNECT with a client id whose
// session exists is refused (0x87; 3.1.1: 0x05) and gets none of its queued
// messages; with session-ownership: fresh it gets an empty session instead.
func TestClientIDBelongsToItsUser(t *testing.T) {
	for _, fresh := range []bool{false, true} {
		t.Run(map[bool]string{false: "refuse", true: "fresh"}[fresh], func(t *testing.T) {
			extra := ""
			if fresh {
				extra = "session-ownership: fresh\n"
			}
			p := startSecure(t, extra)
			addr := p.addrs["tcp"]
			owner := dialAs(t, addr, "shared-id", "billing", mqtttest.WorkerOptions{SessionExpiry: 3600})
			subscribe(t, owner, "orders/eu", 1)
			if err := owner.Disconnect(); err != nil {
				t.Fatal(err)
			}
			pub := dialAs(t, addr, "pub", "billing", mqtttest.WorkerOptions{CleanStart: true})
			if code, err := pub.Publish("orders/eu", []byte("queued for billing"), 1); err != nil || code != 0 {
				t.Fatalf("publish: 0x%02x %v", code, err)
			}
			thief, err := mqtttest.DialWorker(addr, "shared-id", mqtttest.WorkerOptions{Username: "greedy", Password: "greedy-pw", SessionExpiry: 3600, KeepAlive: 30})
			if !fresh {
				var ce *mqtttest.ConnectError
				if !errors.As(err, &ce) || ce.ReasonCode != 0x87 {
					t.Fatalf("another user's CONNECT with the id: %v, want CONNACK 0x87", err)
				}
				// The owner's session is intact.
				back := dialAs(t, addr, "shared-id", "billing", mqtttest.WorkerOptions{SessionExpiry: 3600})
				if !back.Connack().SessionPresent {
					t.Fatal("the owner's session is gone")
				}
				if m := back.Next(mqtttest.Timeout); m == nil || string(m.Payload) != "queued for billing" {
					t.Fatalf("owner after the refused takeover got %v", m)
				}
				// 3.1.1 gets its own return code.
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				code := connectV3Code(t, c, "shared-id", "greedy")
				if code != 0x05 {
					t.Fatalf("3.1.1 CONNACK return code 0x%02x, want 0x05", code)
				}
				return
			}
			if err != nil {
				t.Fatalf("fresh session: %v", err)
			}
			t.Cleanup(func() { _ = thief.Disconnect() })
			if thief.Connack().SessionPresent {
				t.Fatal("another user got the session (session present)")
			}
			if m := thief.Next(300 * time.Millisecond); m != nil {
				t.Fatalf("another user got the owner's queued message %q", m.Payload)
			}
		})
	}
}

// connectV3Code sends a 3.1.1 CONNECT with a persistent session and returns
// the CONNACK return code.
func connectV3Code(t *testing.T, c net.Conn, id, user string) byte {
	t.Helper()
	vh := []byte{0, 4, 'M', 'Q', 'T', 'T', 4, 0xC0, 0, 30}
	vh = appendStr(vh, id)
	vh = appendStr(vh, user)
	vh = appendStr(vh, user+"-pw")
	if _, err := c.Write(append([]byte{0x10, byte(len(vh))}, vh...)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	if n, err := c.Read(buf); err != nil || n < 4 || buf[0] != 0x20 {
		t.Fatalf("CONNACK %x, %v", buf[:n], err)
	}
	return buf[3]
}

// TestGroupsHaveOwners: ACL rules can name share names, and a member whose
// key filters take nothing cannot make a group skip its backlog.
func TestGroupsHaveOwners(t *testing.T) {
	p := startSecure(t, "")
	addr := p.addrs["tcp"]
	intruder := dialAs(t, addr, "intruder-1", "intruder", mqtttest.WorkerOptions{CleanStart: true})
	subscribe(t, intruder, "$share/billing/orders/#", 0x87) // the share name is the billing team's
	subscribe(t, intruder, "$share/mine/orders/#", 1)       // its own group is fine
	// A billing member with a key filter that matches nothing: the backlog waits.
	blocker := dialAs(t, addr, "billing-blocker", "billing", mqtttest.WorkerOptions{CleanStart: true})
	if code, err := blocker.Subscribe("$share/billing/orders/#", 1, "nothing-*"); err != nil || code != 1 {
		t.Fatalf("subscribe with key filter: 0x%02x %v", code, err)
	}
	pub := dialAs(t, addr, "billing-pub", "billing", mqtttest.WorkerOptions{CleanStart: true})
	for i := range 50 {
		if code, err := pub.Publish(fmt.Sprintf("orders/%d", i), []byte(fmt.Sprint(i)), 1); err != nil || code != 0 {
			t.Fatalf("publish %d: 0x%02x %v", i, code, err)
		}
	}
	v := waitGroup(t, p, "billing/orders/#", "50 messages waiting", func(v adminapi.GroupView) bool { return v.Head == 50 && v.UnroutableKeys == 50 })
	if v.Cursor != 0 || v.StoredMessages != 50 {
		t.Fatalf("a member that takes no key made the group skip: %+v", v)
	}
	worker := dialAs(t, addr, "billing-worker", "billing", mqtttest.WorkerOptions{CleanStart: true})
	subscribe(t, worker, "$share/billing/orders/#", 1)
	for i := range 50 {
		m := worker.Next(mqtttest.Timeout)
		if m == nil {
			t.Fatalf("the worker got %d of 50", i)
		}
		if err := worker.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
}

// TestACLDecisionsAreDeterministic: {"#": 3, "secret/#": 0} denies
// secret/plans every time (mochi's map order granted it most of the time).
func TestACLDecisionsAreDeterministic(t *testing.T) {
	p := startSecure(t, "")
	for i := range 30 {
		w := dialAs(t, p.addrs["tcp"], fmt.Sprintf("greedy-%d", i), "greedy", mqtttest.WorkerOptions{CleanStart: true})
		subscribe(t, w, "secret/plans", 0x87)
		subscribe(t, w, "public/news", 1)
		if err := w.Disconnect(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHTTPSafeDefaults: pprof is off unless asked for, the admin API answers
// only to known Host names (DNS rebinding), WebSocket upgrades check Origin,
// and the token can come from the environment.
func TestHTTPSafeDefaults(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--ws", "127.0.0.1:0", "--http-allowed-hosts", "broker.example")
	base := "http://" + p.addrs["http"]
	get := func(path, host string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, host string
		want       int
	}{
		{"/debug/pprof/", "", 404},
		{"/api/v1/groups", "", 200},
		{"/api/v1/groups", "localhost", 200},
		{"/api/v1/groups", "broker.example:9883", 200},
		{"/api/v1/groups", "attacker.example", 403},
		{"/api/v1/dlq?group=a/b", "attacker.example:9883", 403},
		{"/metrics", "attacker.example", 403}, // Hostile clients II: a rebinding page could read it
		{"/metrics", "broker.example", 200},
		{"/healthz", "attacker.example", 200},
	} {
		if got := get(tc.path, tc.host); got != tc.want {
			t.Errorf("GET %s with Host %q = %d, want %d", tc.path, tc.host, got, tc.want)
		}
	}
	ws := "ws://" + p.addrs["ws"] + "/"
	for origin, ok := range map[string]bool{"": true, "http://" + p.addrs["ws"]: true, "http://attacker.example": false} {
		h := http.Header{}
		if origin != "" {
			h.Set("Origin", origin)
		}
		d := websocket.Dialer{Subprotocols: []string{"mqtt"}, HandshakeTimeout: mqtttest.Timeout}
		c, resp, err := d.Dial(ws, h)
		if (err == nil) != ok {
			t.Errorf("WebSocket from origin %q: %v (%v), want allowed %v", origin, err, resp, ok)
		}
		if c != nil {
			c.Close()
		}
	}

	t.Setenv("KEYLINE_HTTP_TOKEN", "from-env")
	q := startKeyline(t, t.TempDir(), "--pprof")
	resp, err := http.Get("http://" + q.addrs["http"] + "/api/v1/groups")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("with KEYLINE_HTTP_TOKEN set, GET without a token = %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+q.addrs["http"]+"/debug/pprof/", nil)
	req.Header.Set("Authorization", "Bearer from-env")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("pprof with --pprof and the token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// TestNamesThatCannotBeEncodedAreRefused: a share name past 256 bytes gets
// SUBACK 0x8F; a dead letter whose $dlq/<share>/<topic> would pass MQTT's
// 65,535 bytes is published on $dlq/<share> with its topic in dlq-topic.
func TestNamesThatCannotBeEncodedAreRefused(t *testing.T) {
	// The topic is the routing key here: allow keys as long as topics.
	p := startKeyline(t, t.TempDir(), "--max-deliveries", "1", "--max-key-size", "65535")
	addr := p.addrs["tcp"]
	w := dialAs(t, addr, "namer", "", mqtttest.WorkerOptions{CleanStart: true})
	subscribe(t, w, "$share/"+strings.Repeat("s", 257)+"/t/#", 0x8F)
	share := strings.Repeat("s", 256)
	subscribe(t, w, "$share/"+share+"/long/#", 1)
	watch := dialAs(t, addr, "watch", "", mqtttest.WorkerOptions{CleanStart: true})
	subscribe(t, watch, "$dlq/#", 1)
	topic := "long/" + strings.Repeat("t", 65400)
	pub := dialAs(t, addr, "pub", "", mqtttest.WorkerOptions{CleanStart: true})
	// The topic is too long to be the routing key (--max-key-size): give a key.
	if code, err := pub.Publish(topic, []byte("x"), 1, mqtttest.UserProperty{Key: "key", Value: "k"}); err != nil || code != 0 {
		t.Fatalf("publish: 0x%02x %v", code, err)
	}
	m := w.Next(mqtttest.Timeout)
	if m == nil {
		t.Fatal("the member got nothing")
	}
	if err := w.Nack(m, 0x99); err != nil { // payload format invalid: dead-letter at once
		t.Fatal(err)
	}
	d := watch.Next(mqtttest.Timeout)
	if d == nil {
		t.Fatal("no dead letter on $dlq/#")
	}
	if orig, _ := d.Prop("dlq-topic"); d.Topic != "$dlq/"+share || orig != topic {
		t.Fatalf("dead letter on %.40q (dlq-topic %d bytes), want $dlq/<share> with the original topic", d.Topic, len(orig))
	}
}
