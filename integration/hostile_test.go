package integration

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
	"github.com/keyline-mq/keyline/internal/poll"
)

// The tests in this file are the attacks of "Hostile clients II", run
// against the built binary: each one once succeeded.

// disconnectedWith waits for the broker to end w's connection and checks the
// DISCONNECT's reason code.
func disconnectedWith(t *testing.T, w *mqtttest.Worker, code byte) {
	t.Helper()
	select {
	case <-w.Done():
	case <-time.After(mqtttest.Timeout):
		t.Fatalf("%s: the broker did not disconnect it", w.ClientID)
	}
	var de *mqtttest.DisconnectError
	if err := w.Err(); !errors.As(err, &de) || de.ReasonCode != code {
		t.Fatalf("%s: connection ended with %v, want DISCONNECT %#x", w.ClientID, err, code)
	}
}

// TestInboundTopicAliasesAreBounded: the CONNACK offers a Topic Alias
// Maximum (16 by default) and the broker keeps a copy of each alias's topic
// for as long as the connection lasts, within 64 KiB. mochi kept the topic
// as a view into the packet that set it, allowed 65,535 aliases, and kept
// them with an offline session: three sessions that set 16 aliases each
// with 1 MB publishes pinned 48 MB. Past the maximum: DISCONNECT 0x94; past
// the bytes: DISCONNECT 0x97.
func TestInboundTopicAliasesAreBounded(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--pprof")
	addr := p.addrs["tcp"]
	sub := dialWorker(t, addr, "sub")
	subscribeWorker(t, sub, "check/#")
	before := sampleHeap(t, p)
	payload := make([]byte, 1_000_000)
	var offered uint16
	for s := range 3 {
		w, err := mqtttest.DialWorker(addr, fmt.Sprintf("aliaser-%d", s), mqtttest.WorkerOptions{SessionExpiry: 3600, KeepAlive: 30})
		if err != nil {
			t.Fatal(err)
		}
		offered = w.Connack().TopicAliasMax
		for a := range uint16(16) {
			o := mqtttest.Outgoing{Topic: fmt.Sprintf("alias/%d/%d", s, a), Payload: payload, QoS: 1, TopicAlias: a + 1}
			if rc, err := w.PublishMessage(o); err != nil || rc != 0 {
				t.Fatalf("publish with alias %d: %#x %v", a+1, rc, err)
			}
		}
		w.Close() // the session stays, offline
	}
	after := sampleHeap(t, p)
	const bound = 8 << 20
	t.Logf("heap %.1f MiB before, %.1f MiB after 3 offline sessions set 16 aliases each with 1 MB publishes (bound +%.0f MiB; mochi kept 48 MB)",
		mib(before.heap), mib(after.heap), mib(bound))
	if after.heap > before.heap+bound {
		t.Fatalf("heap grew by %.1f MiB: the aliases keep the packets", mib(after.heap-before.heap))
	}
	if offered != 16 {
		t.Fatalf("CONNACK Topic Alias Maximum %d, want 16", offered)
	}

	w := dialWorker(t, addr, "aliaser")
	if rc, err := w.PublishMessage(mqtttest.Outgoing{Topic: "check/a", Payload: []byte("set"), QoS: 1, TopicAlias: 1}); err != nil || rc != 0 {
		t.Fatalf("publish setting alias 1: %#x %v", rc, err)
	}
	if rc, err := w.PublishMessage(mqtttest.Outgoing{Payload: []byte("by alias"), QoS: 1, TopicAlias: 1}); err != nil || rc != 0 {
		t.Fatalf("publish by alias 1: %#x %v", rc, err)
	}
	for _, want := range []string{"set", "by alias"} {
		if m := sub.Next(mqtttest.Timeout); m == nil || m.Topic != "check/a" || string(m.Payload) != want {
			t.Fatalf("subscriber got %+v, want %q on check/a", m, want)
		}
	}
	_, _ = w.PublishMessage(mqtttest.Outgoing{Topic: "check/b", Payload: []byte("x"), QoS: 1, TopicAlias: 17})
	disconnectedWith(t, w, 0x94) // Topic Alias invalid

	w = dialWorker(t, addr, "aliaser-long")
	long := strings.Repeat("l", 40<<10)
	if rc, err := w.PublishMessage(mqtttest.Outgoing{Topic: "check/" + long, Payload: []byte("x"), QoS: 1, TopicAlias: 1}); err != nil || rc != 0 {
		t.Fatalf("publish setting alias 1 to a 40 KiB topic: %#x %v", rc, err)
	}
	_, _ = w.PublishMessage(mqtttest.Outgoing{Topic: "check/2" + long, Payload: []byte("x"), QoS: 1, TopicAlias: 2})
	disconnectedWith(t, w, 0x97) // Quota exceeded: 64 KiB of alias topics
}

// cpuSeconds returns the user and system CPU time the broker has used.
func cpuSeconds(t *testing.T, p *proc) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), ") ") // after the command name, which may hold spaces
	f := strings.Fields(rest)                  // f[11], f[12]: utime, stime (fields 14 and 15)
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // clock ticks; USER_HZ is 100 on Linux
}

// TestTopicDepthIsCapped: a topic or filter deeper than --max-topic-levels
// (128) is refused (SUBACK 0x8F, PUBACK 0x90; MQTT 3.1.1: SUBACK 0x80, a
// publish disconnects), and the one at the cap goes through. One SUBSCRIBE of
// 29,999 '+' levels once cost 7.45 s of CPU (mochi's topic walk was
// quadratic in depth).
func TestTopicDepthIsCapped(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	w := dialWorker(t, addr, "deep")
	at, past := strings.Repeat("a/", 127)+"a", strings.Repeat("a/", 128)+"a"
	for _, tc := range []struct {
		filter string
		want   byte
	}{{at, 1}, {past, 0x8F}, {"$share/g/" + at, 1}, {"$share/g/" + past, 0x8F}, {strings.Repeat("+/", 128) + "#", 0x8F}} {
		if rc, err := w.Subscribe(tc.filter, 1); err != nil || rc != tc.want {
			t.Fatalf("SUBSCRIBE to %d levels: %#x %v, want %#x", strings.Count(tc.filter, "/")+1, rc, err, tc.want)
		}
	}
	cpu := cpuSeconds(t, p)
	if rc, err := w.Subscribe(strings.Repeat("+/", 29_998)+"+", 1); err != nil || rc != 0x8F {
		t.Fatalf("SUBSCRIBE to 29,999 levels: %#x %v, want 0x8F", rc, err)
	}
	t.Logf("a SUBSCRIBE of 29,999 '+' levels cost %.2f s of the broker's CPU (7.45 s before the cap)", cpuSeconds(t, p)-cpu)
	for _, tc := range []struct {
		topic string
		want  byte
	}{{at, 0}, {past, 0x90}} {
		if rc, err := w.Publish(tc.topic, []byte("x"), 1); err != nil || rc != tc.want {
			t.Fatalf("PUBLISH to %d levels: %#x %v, want %#x", strings.Count(tc.topic, "/")+1, rc, err, tc.want)
		}
	}
	if m := w.Next(mqtttest.Timeout); m == nil || m.Topic != at {
		t.Fatalf("got %+v, want the publish at the cap", m)
	}

	v3 := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, addr), "deep-311", true, nil)
	if rc := v3.Subscribe(t, past, 1); rc != 0x80 {
		t.Fatalf("MQTT 3.1.1 SUBSCRIBE to 129 levels: %#x, want 0x80", rc)
	}
	if rc := v3.Subscribe(t, at, 1); rc != 1 {
		t.Fatalf("MQTT 3.1.1 SUBSCRIBE to 128 levels: %#x, want 1", rc)
	}
	tok := v3.Client.Publish(past, 1, false, "x")
	tok.WaitTimeout(mqtttest.Timeout)
	if tok.Error() == nil && v3.Client.IsConnectionOpen() {
		t.Fatal("MQTT 3.1.1 PUBLISH to 129 levels: still connected")
	}
}

// rawConn is a raw MQTT connection, for what no client library sends.
type rawConn struct {
	t       *testing.T
	c       net.Conn
	r       *mqttwire.Reader
	version byte
}

func dialRawConn(t *testing.T, addr, id string, version byte) *rawConn {
	t.Helper()
	return dialRawConnect(t, addr, &mqttwire.Connect{Version: version, ClientID: id, CleanStart: true, KeepAlive: 60})
}

// dialRawConnect connects with CONNECT c and expects a CONNACK.
func dialRawConnect(t *testing.T, addr string, connect *mqttwire.Connect) *rawConn {
	t.Helper()
	id, version := connect.ClientID, connect.Version
	c, err := net.DialTimeout("tcp", addr, mqtttest.Timeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc := &rawConn{t: t, c: c, r: mqttwire.NewReader(c, 0), version: version}
	rc.write(mqttwire.AppendConnect(nil, connect))
	if p := rc.next(); p.Type != mqttwire.TypeConnack {
		t.Fatalf("%s: got %s, want CONNACK", id, mqttwire.TypeName(p.Type))
	}
	return rc
}

func (rc *rawConn) write(frame []byte) {
	rc.t.Helper()
	if _, err := rc.c.Write(frame); err != nil {
		rc.t.Fatal(err)
	}
}

func (rc *rawConn) next() mqttwire.Packet {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	p, err := rc.r.Next()
	if err != nil {
		rc.t.Fatalf("read: %v", err)
	}
	return p
}

// closedSilently checks that the broker closes the connection without
// sending anything more (MQTT 3.1.1 has no DISCONNECT from the server).
func (rc *rawConn) closedSilently() {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	p, err := rc.r.Next()
	if err == nil {
		rc.t.Fatalf("the broker sent %s before closing, want nothing", mqttwire.TypeName(p.Type))
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		rc.t.Fatal("the broker did not close the connection")
	}
}

// TestMQTT311GetsNoDisconnect: MQTT 3.1.1 has no DISCONNECT from the server;
// mochi sent one (with an MQTT 5 reason code) whenever it closed a 3.1.1
// client: a publish it refused, a session taken over, an operator's
// disconnect.
func TestMQTT311GetsNoDisconnect(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	refused := dialRawConn(t, addr, "refused", mqttwire.Version311)
	refused.write(mqttwire.AppendPublish(nil, mqttwire.Version311, &mqttwire.Publish{Topic: "$dlq/x", QoS: 1, PacketID: 1, Payload: []byte("x")}))
	refused.closedSilently()

	old := dialRawConn(t, addr, "taken", mqttwire.Version311)
	dialRawConn(t, addr, "taken", mqttwire.Version311)
	old.closedSilently()

	kicked := dialRawConn(t, addr, "kicked", mqttwire.Version311)
	resp, err := http.Post("http://"+p.addrs["http"]+"/api/v1/clients/kicked/disconnect", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST disconnect: %s", resp.Status)
	}
	kicked.closedSilently()
}

// TestQoS2RetransmitGetsPubrecSuccess: a QoS 2 PUBLISH sent again with DUP
// before the PUBREL (the client did not see the PUBREC) gets PUBREC 0x00
// again and is delivered once; mochi answered 0x91, which tells the client
// the message was refused.
func TestQoS2RetransmitGetsPubrecSuccess(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	sub := dialWorker(t, addr, "sub")
	subscribeWorker(t, sub, "q2/#")
	for _, version := range []byte{mqttwire.Version311, mqttwire.Version5} {
		pub := dialRawConn(t, addr, fmt.Sprintf("pub-%d", version), version)
		msg := &mqttwire.Publish{Topic: fmt.Sprintf("q2/%d", version), QoS: 2, PacketID: 9, Payload: []byte("once")}
		for i := range 2 {
			msg.Dup = i > 0
			pub.write(mqttwire.AppendPublish(nil, version, msg))
			p := pub.next()
			ack, err := mqttwire.DecodeAck(version, p)
			if err != nil || p.Type != mqttwire.TypePubrec || ack.PacketID != 9 || ack.ReasonCode != 0 {
				t.Fatalf("v%d, publish %d (DUP %v): %s %+v %v, want PUBREC 9 0x00", version, i+1, msg.Dup, mqttwire.TypeName(p.Type), ack, err)
			}
		}
		pub.write(mqttwire.AppendAck(nil, mqttwire.TypePubrel, 9, 0))
		if p := pub.next(); p.Type != mqttwire.TypePubcomp {
			t.Fatalf("v%d: got %s after PUBREL, want PUBCOMP", version, mqttwire.TypeName(p.Type))
		}
		if m := sub.Next(mqtttest.Timeout); m == nil || m.Topic != msg.Topic {
			t.Fatalf("v%d: subscriber got %+v, want the message", version, m)
		}
	}
	// A second delivery would have been queued before this marker.
	if rc, err := sub.Publish("q2/end", []byte("end"), 1); err != nil || rc != 0 {
		t.Fatalf("marker: %#x %v", rc, err)
	}
	if m := sub.Next(mqtttest.Timeout); m == nil || m.Topic != "q2/end" {
		t.Fatalf("got %+v, want the marker: a retransmission was delivered twice", m)
	}
}

// TestSubscribeOptionsAreChecked: reserved subscription option bits
// (DISCONNECT 0x81), Retain Handling 3 and a Subscription Identifier of 0
// (0x82) are refused; mochi granted them. A SUBSCRIBE whose last filter
// lacks its options byte made mochi read past the packet: the panic ended
// the broker.
func TestSubscribeOptionsAreChecked(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	str, props := mqtttest.Str, mqtttest.Props
	for _, tc := range []struct {
		name  string
		frame []byte
		want  byte // DISCONNECT reason code; 0: the connection just closes
	}{
		{"reserved bit 6", mqtttest.Frame(mqttwire.TypeSubscribe, 2, mqtttest.U16(1), props(), str("a"), []byte{0x41}), 0x81},
		{"reserved bit 7", mqtttest.Frame(mqttwire.TypeSubscribe, 2, mqtttest.U16(1), props(), str("a"), []byte{0x81}), 0x81},
		{"retain handling 3", mqtttest.Frame(mqttwire.TypeSubscribe, 2, mqtttest.U16(1), props(), str("a"), []byte{0x31}), 0x82},
		{"subscription identifier 0", mqtttest.Frame(mqttwire.TypeSubscribe, 2, mqtttest.U16(1), props([]byte{mqttwire.PropSubscriptionID, 0}), str("a"), []byte{1}), 0x82},
		{"no options byte", mqtttest.Frame(mqttwire.TypeSubscribe, 2, mqtttest.U16(1), props(), str("a")), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRawConn(t, addr, "opts", mqttwire.Version5)
			rc.write(tc.frame)
			if tc.want == 0 {
				rc.closedSilently()
			} else {
				p := rc.next()
				d, err := mqttwire.DecodeDisconnect(mqttwire.Version5, p)
				if err != nil || p.Type != mqttwire.TypeDisconnect || d.ReasonCode != tc.want {
					t.Fatalf("got %s %+v %v, want DISCONNECT %#x", mqttwire.TypeName(p.Type), d, err, tc.want)
				}
			}
			dialRawConn(t, addr, "after", mqttwire.Version5) // the broker is still there
		})
	}
}

// TestLongClientIDsAreRefused: a client id longer than --max-client-id (1
// KiB) is refused, CONNACK 0x85 (3.1.1: 0x02); one at the cap keeps its
// session. A 40,000-byte id with clean start 0 once got CONNACK 0 and a
// session that could never be stored (bbolt keys are at most 32 KiB).
func TestLongClientIDsAreRefused(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	long, atCap := strings.Repeat("x", 40_000), strings.Repeat("y", 1024)
	for _, version := range []byte{mqttwire.Version311, mqttwire.Version5} {
		c, err := net.DialTimeout("tcp", addr, mqtttest.Timeout)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: version, ClientID: long, KeepAlive: 30})); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
		pk, err := mqttwire.NewReader(c, 0).Next()
		if err != nil {
			t.Fatal(err)
		}
		ack, err := mqttwire.DecodeConnack(version, pk)
		want := map[byte]byte{mqttwire.Version311: 0x02, mqttwire.Version5: 0x85}[version]
		if err != nil || ack.ReasonCode != want {
			t.Fatalf("v%d CONNACK for a 40,000-byte id: %+v %v, want %#x", version, ack, err, want)
		}
	}
	for i := range 2 {
		w, err := mqtttest.DialWorker(addr, atCap, mqtttest.WorkerOptions{SessionExpiry: 3600})
		if err != nil {
			t.Fatalf("a 1 KiB id: %v", err)
		}
		if present := w.Connack().SessionPresent; present != (i == 1) {
			t.Fatalf("connection %d of a 1 KiB id: session present %v", i+1, present)
		}
		w.Close()
	}
}

// TestSubscriptionsAreBounded: a client holds at most
// --max-subscriptions-per-client (1,000) subscriptions; past it SUBACK 0x97
// (3.1.1: 0x80). A persistent session that sent 100,000 filters once grew
// the heap by 192 MiB (3.9 -> 195.6), kept for the week its session lasts.
func TestSubscriptionsAreBounded(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--pprof")
	addr := p.addrs["tcp"]
	before := sampleHeap(t, p)
	rc := dialRawConnect(t, addr, &mqttwire.Connect{Version: mqttwire.Version5, ClientID: "hoarder", KeepAlive: 60,
		Props: mqttwire.Properties{SessionExpiry: 7 * 24 * 3600}})
	granted, refused := 0, 0
	for n := range 100 {
		s := &mqttwire.Subscribe{PacketID: uint16(n + 1)}
		for i := range 1000 {
			s.Filters = append(s.Filters, mqttwire.Subscription{Filter: fmt.Sprintf("hoard/%d/%d/+", n, i), Options: 1})
		}
		rc.write(mqttwire.AppendSubscribe(nil, mqttwire.Version5, s))
		ack, err := mqttwire.DecodeSuback(mqttwire.Version5, rc.next())
		if err != nil {
			t.Fatal(err)
		}
		for _, code := range ack.ReasonCodes {
			switch code {
			case 1:
				granted++
			case 0x97:
				refused++
			default:
				t.Fatalf("SUBACK code %#x", code)
			}
		}
	}
	rc.write(mqttwire.AppendDisconnect(nil, 0))
	rc.closedSilently()
	after := sampleHeap(t, p)
	const bound = 8 << 20
	t.Logf("heap %.1f MiB before, %.1f MiB after an offline session asked for 100,000 subscriptions (bound +%.0f MiB; +192 MiB before the cap)",
		mib(before.heap), mib(after.heap), mib(bound))
	if granted != 1000 || refused != 99_000 {
		t.Fatalf("granted %d, refused %d; want 1,000 and 99,000", granted, refused)
	}
	if after.heap > before.heap+bound {
		t.Fatalf("heap grew by %.1f MiB", mib(after.heap-before.heap))
	}
	v3 := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, addr), "hoarder-311", true, nil)
	for i := range 1000 {
		if rc := v3.Subscribe(t, fmt.Sprintf("h311/%d", i), 0); rc != 0 {
			t.Fatalf("MQTT 3.1.1 subscription %d: %#x", i+1, rc)
		}
	}
	if rc := v3.Subscribe(t, "h311/one-more", 0); rc != 0x80 {
		t.Fatalf("MQTT 3.1.1 subscription 1,001: %#x, want 0x80", rc)
	}
}

// TestOutboundTopicAliasesAreBounded: the topics the broker gives aliases to
// a subscriber take at most --topic-alias-bytes (64 KiB) of its connection;
// later topics go without an alias. The table once held every topic up to
// the client's Topic Alias Maximum: 1,000 topics of 30 KB kept 31 MB per
// subscriber.
func TestOutboundTopicAliasesAreBounded(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--pprof")
	addr := p.addrs["tcp"]
	pub := dialWorker(t, addr, "alias-pub")
	pad := strings.Repeat("t", 30_000)
	// round sends 1,000 topics of 30 KB to a new subscriber that allows
	// aliasMax aliases, one at a time (nothing is dropped), and counts the
	// deliveries that carried an alias.
	round := func(id string, aliasMax uint16) (aliased int) {
		sub := dialRawConnect(t, addr, &mqttwire.Connect{Version: mqttwire.Version5, ClientID: id, CleanStart: true, KeepAlive: 60,
			Props: mqttwire.Properties{TopicAliasMaximum: aliasMax}})
		sub.write(mqttwire.AppendSubscribe(nil, mqttwire.Version5, &mqttwire.Subscribe{PacketID: 1, Filters: []mqttwire.Subscription{{Filter: "big/#"}}}))
		if p := sub.next(); p.Type != mqttwire.TypeSuback {
			t.Fatalf("got %s, want SUBACK", mqttwire.TypeName(p.Type))
		}
		for i := range 1000 {
			topic := fmt.Sprintf("big/%d/%s", i, pad)
			if rc, err := pub.Publish(topic, []byte("x"), 1); err != nil || rc != 0 {
				t.Fatalf("publish %d: %#x %v", i, rc, err)
			}
			v, err := mqttwire.DecodePublish(mqttwire.Version5, sub.next())
			if err != nil {
				t.Fatal(err)
			}
			props, err := v.Props.Parse()
			if err != nil {
				t.Fatal(err)
			}
			if string(v.Topic) != topic {
				t.Fatalf("publish %d arrived on %.20q...", i, v.Topic)
			}
			if props.TopicAlias != 0 {
				aliased++
			}
		}
		return aliased
	}
	// A first subscriber without aliases fills the broker's topic caches
	// (bounded on their own, in entries and bytes), so that what follows
	// measures the alias table alone.
	round("warm-up", 0)
	before := sampleHeap(t, p)
	aliased := round("alias-sub", 1000) // stays connected: its table lives with the connection
	after := sampleHeap(t, p)
	const bound = 8 << 20
	t.Logf("heap %.1f MiB before, %.1f MiB after a subscriber allowing 1,000 aliases got 1,000 topics of 30 KB (bound +%.0f MiB; +35.7 MiB before the bound); %d got an alias",
		mib(before.heap), mib(after.heap), mib(bound), aliased)
	if after.heap > before.heap+bound {
		t.Fatalf("heap grew by %.1f MiB: the alias table keeps every topic", mib(after.heap-before.heap))
	}
	if aliased != 2 {
		t.Fatalf("%d topics of 30 KB got an alias, want 2 (64 KiB)", aliased)
	}
}

// TestDropSignalCannotBeForged: a publisher's own user property "dropped"
// does not reach a subscriber that asked for the drop signal (it would read
// as the broker's count of lost messages); other subscribers get the
// publish as it was sent. It once reached the signal subscriber unchanged.
func TestDropSignalCannotBeForged(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	signal := dialRawConnect(t, addr, &mqttwire.Connect{Version: mqttwire.Version5, ClientID: "signal", CleanStart: true, KeepAlive: 60,
		Props: mqttwire.Properties{User: []mqttwire.UserProperty{{Key: "drop-signal", Value: "1"}}}})
	signal.write(mqttwire.AppendSubscribe(nil, mqttwire.Version5, &mqttwire.Subscribe{PacketID: 1, Filters: []mqttwire.Subscription{{Filter: "forge/#", Options: 1}}}))
	if p := signal.next(); p.Type != mqttwire.TypeSuback {
		t.Fatalf("got %s, want SUBACK", mqttwire.TypeName(p.Type))
	}
	plain := dialWorker(t, addr, "plain")
	subscribeWorker(t, plain, "forge/#")
	pub := dialWorker(t, addr, "forger")
	for qos := range byte(2) {
		topic := fmt.Sprintf("forge/%d", qos)
		props := []mqtttest.UserProperty{{Key: "dropped", Value: "999999"}, {Key: "app", Value: "kept"}}
		if _, err := pub.Publish(topic, []byte("x"), qos, props...); err != nil {
			t.Fatal(err)
		}
		v, err := mqttwire.DecodePublish(mqttwire.Version5, signal.next())
		if err != nil {
			t.Fatal(err)
		}
		got, err := v.Props.Parse()
		if err != nil {
			t.Fatal(err)
		}
		if string(v.Topic) != topic || fmt.Sprint(got.User) != fmt.Sprint([]mqttwire.UserProperty{{Key: "app", Value: "kept"}}) {
			t.Fatalf("QoS %d: the signal subscriber got %s with %v, want only app=kept", qos, v.Topic, got.User)
		}
		if qos > 0 {
			signal.write(mqttwire.AppendAck(nil, mqttwire.TypePuback, v.PacketID, 0))
		}
		m := plain.Next(mqtttest.Timeout)
		if m == nil || fmt.Sprint(m.User) != fmt.Sprint(props) {
			t.Fatalf("QoS %d: the plain subscriber got %+v, want the publisher's properties", qos, m)
		}
	}
}

// TestTooLargeForAMemberMeansNotEligible: a member whose Maximum Packet
// Size a message does not fit is not offered it: another member gets it, or
// it waits for one, as for a topic it may not read. Such messages were
// dead-lettered (0x95) at the first attempt: 37 of 100 of another tenant's.
func TestTooLargeForAMemberMeansNotEligible(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["tcp"]
	small, err := mqtttest.DialWorker(addr, "small", mqtttest.WorkerOptions{CleanStart: true, KeepAlive: 30, MaximumPacketSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	subscribeWorker(t, small, "$share/sized/jobs/#")
	pub := dialWorker(t, addr, "pub")
	const n = 100
	bigPayload, smallPayload := make([]byte, 2000), []byte("small")
	for i := range n {
		payload := smallPayload
		if i%2 == 0 {
			payload = bigPayload
		}
		if rc, err := pub.Publish(fmt.Sprintf("jobs/%d", i), payload, 1, mqtttest.UserProperty{Key: "key", Value: fmt.Sprint(i)}); err != nil || rc != 0 {
			t.Fatalf("publish %d: %#x %v", i, rc, err)
		}
	}
	for range n / 2 {
		m := small.Next(mqtttest.Timeout)
		if m == nil || len(m.Payload) != len(smallPayload) {
			t.Fatalf("the small member got %+v, want a small message", m)
		}
		if err := small.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
	v := waitGroup(t, p, "sized/jobs/#", "the large messages waiting for a member that takes them", func(v adminapi.GroupView) bool {
		return v.UnroutableKeys == n/2
	})
	if v.DeadLetters != 0 {
		t.Fatalf("%d dead letters, want none: the large ones wait", v.DeadLetters)
	}
	large := dialWorker(t, addr, "large")
	subscribeWorker(t, large, "$share/sized/jobs/#")
	for range n / 2 {
		m := large.Next(mqtttest.Timeout)
		if m == nil || len(m.Payload) != len(bigPayload) {
			t.Fatalf("the large member got %+v, want a large message", m)
		}
		if err := large.Ack(m); err != nil {
			t.Fatal(err)
		}
	}
	v = waitGroup(t, p, "sized/jobs/#", "every message acknowledged", func(v adminapi.GroupView) bool { return v.Backlog == 0 })
	if v.DeadLetters != 0 {
		t.Fatalf("%d dead letters, want none", v.DeadLetters)
	}
	if m := small.Next(0); m != nil {
		t.Fatalf("the small member got %d bytes", len(m.Payload))
	}
}

// groupNames lists the broker's groups.
func groupNames(t *testing.T, p *proc) []string {
	t.Helper()
	c, err := adminapi.Dial(p.addrs["http"], "")
	if err != nil {
		t.Fatal(err)
	}
	gl, _, err := adminapi.Call(t.Context(), c, adminapi.ListGroups())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range gl.Groups {
		out = append(out, g.Name)
	}
	return out
}

// dialFrom connects a worker from local address ip (any of 127.0.0.0/8 on
// Linux's loopback).
func dialFrom(t *testing.T, addr, ip, id string, o mqtttest.WorkerOptions) *mqtttest.Worker {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: mqtttest.Timeout}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	w, err := mqtttest.ConnectWorker(c, id, o)
	if err != nil {
		t.Fatalf("%s from %s: %v", id, ip, err)
	}
	t.Cleanup(w.Close)
	return w
}

// TestGroupsCannotBeExhausted: the groups the clients of one user (with
// auth) or one address (without) create are bounded by --max-groups-per-user,
// so throwaway client ids cannot take every group: 100 ids x 100 groups once
// reached --max-groups in 2 s, and a legitimate $share got 0x97.
func TestGroupsCannotBeExhausted(t *testing.T) {
	t.Run("per user", func(t *testing.T) {
		p := startSecure(t, "", "--fsync=false", "--max-groups", "50", "--max-groups-per-user", "10")
		addr := p.addrs["tcp"]
		granted := 0
		for i := range 100 {
			w := dialAs(t, addr, fmt.Sprintf("throwaway-%d", i), "evil", mqtttest.WorkerOptions{CleanStart: true})
			rc, err := w.Subscribe(fmt.Sprintf("$share/g%d/orders/#", i), 1)
			if err != nil {
				t.Fatal(err)
			}
			if rc == 1 {
				granted++
			} else if rc != 0x97 {
				t.Fatalf("subscription %d: %#x", i, rc)
			}
			w.Close()
		}
		if granted != 10 {
			t.Fatalf("evil created %d groups, want 10", granted)
		}
		billing := dialAs(t, addr, "billing-1", "billing", mqtttest.WorkerOptions{CleanStart: true})
		subscribe(t, billing, "$share/billing/orders/#", 1)
	})
	t.Run("per address", func(t *testing.T) {
		p := startKeyline(t, t.TempDir(), "--fsync=false", "--max-groups-per-user", "10")
		addr := p.addrs["tcp"]
		for i := range 11 {
			w := dialFrom(t, addr, "127.0.0.2", fmt.Sprintf("a-%d", i), mqtttest.WorkerOptions{CleanStart: true})
			want := byte(1)
			if i == 10 {
				want = 0x97
			}
			if rc, err := w.Subscribe(fmt.Sprintf("$share/g%d/x/#", i), 1); err != nil || rc != want {
				t.Fatalf("group %d from 127.0.0.2: %#x %v, want %#x", i+1, rc, err, want)
			}
			w.Close()
		}
		other := dialFrom(t, addr, "127.0.0.3", "b", mqtttest.WorkerOptions{CleanStart: true})
		subscribeWorker(t, other, "$share/other/x/#")
		joiner := dialFrom(t, addr, "127.0.0.2", "a-join", mqtttest.WorkerOptions{CleanStart: true})
		subscribeWorker(t, joiner, "$share/g0/x/#") // joining a group takes none
	})
}

// TestGroupsHoldingOnlyMessagesAreReclaimed: a group without members that
// holds messages is deleted with them after --group-backlog-ttl, so joining,
// publishing and leaving cannot keep a group alive for ever; one holding
// dead letters is kept for its operator. A group holding messages was never
// deleted.
func TestGroupsHoldingOnlyMessagesAreReclaimed(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--group-backlog-ttl", "2s")
	addr := p.addrs["tcp"]
	pub := dialWorker(t, addr, "pub")
	for _, name := range []string{"holding", "dead"} {
		w := dialWorker(t, addr, name+"-member")
		subscribeWorker(t, w, "$share/"+name+"/"+name+"/#")
		if name == "dead" {
			publishKey(t, pub, "dead/1", "k", "poison")
			m := w.Next(mqtttest.Timeout)
			if m == nil {
				t.Fatal("no message for the dead-letter group")
			}
			if err := w.Nack(m, 0x87); err != nil { // never retried: dead-lettered at once
				t.Fatal(err)
			}
			waitGroup(t, p, "dead/dead/#", "the dead letter", func(v adminapi.GroupView) bool { return v.DeadLetters == 1 })
		}
		w.Close()
	}
	publishKey(t, pub, "holding/1", "k", "waits")
	waitGroup(t, p, "holding/holding/#", "the backlog", func(v adminapi.GroupView) bool { return v.Backlog == 1 && len(v.Members) == 0 })
	// The TTL is wall-clock time: poll for its end (2 s, swept every second).
	poll.Until(t, mqtttest.Timeout, "the member-less group holding a message to be deleted", func() bool {
		return !slices.Contains(groupNames(t, p), "holding/holding/#")
	})
	if !slices.Contains(groupNames(t, p), "dead/dead/#") {
		t.Fatal("the group holding a dead letter was deleted")
	}
}

// httpGetHost sends GET url with Host header host and returns the status and body.
func httpGetHost(t *testing.T, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// TestMetricsAnswerOnlyAllowedHosts: /metrics answers only IP addresses,
// localhost and --http-allowed-hosts, like the admin API (a DNS-rebinding
// page could read it), and a label never carries a raw control byte from a
// client's share name. /healthz and /readyz answer any Host.
func TestMetricsAnswerOnlyAllowedHosts(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--http-allowed-hosts", "keyline.internal")
	base := "http://" + p.addrs["http"]
	w := dialWorker(t, p.addrs["tcp"], "w")
	subscribeWorker(t, w, "$share/evil\x1b[2J\x1b]0;pwned\x07/x/#")
	for _, tc := range []struct {
		path, host string
		want       int
	}{
		{"/metrics", "rebind.attacker.example", http.StatusForbidden},
		{"/metrics", p.addrs["http"], http.StatusOK},
		{"/metrics", "keyline.internal:9883", http.StatusOK},
		{"/healthz", "rebind.attacker.example", http.StatusOK},
		{"/readyz", "rebind.attacker.example", http.StatusOK},
	} {
		status, body := httpGetHost(t, base+tc.path, tc.host)
		if status != tc.want {
			t.Fatalf("GET %s with Host %s: %d, want %d", tc.path, tc.host, status, tc.want)
		}
		if tc.path == "/metrics" && status == http.StatusOK {
			if !strings.Contains(body, `keyline_group_members{group="evil\\x1b[2J`) {
				t.Fatalf("no escaped group label in the scrape")
			}
			for i := range len(body) {
				if c := body[i]; c < 0x20 && c != '\n' {
					t.Fatalf("the scrape carries the control byte %#x: %q", c, body[max(0, i-40):min(len(body), i+40)])
				}
			}
		}
	}
}

// holdHTTP opens n connections to addr from local address ip; with request
// set, each sends one keep-alive GET /healthz, reads the answer and stays
// open, idle; without, each sends nothing. It returns how many the broker
// kept open to the end.
func holdHTTP(t *testing.T, addr, ip string, n int, request bool) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: mqtttest.Timeout}
	var conns []net.Conn
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
		if !request {
			continue
		}
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
			continue // closed to make room for a newer one
		}
		_ = c.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		_ = c.SetReadDeadline(time.Time{})
	}
	return conns
}

// TestIdleHTTPConnectionsCannotLockOut: idle keep-alive connections and
// connections that send nothing, from another address or from the
// operator's own, cannot keep /healthz from answering: at a bound the
// oldest connection without a request in progress makes room. 256 idle
// keep-alive connections once locked /healthz out (no token needed).
func TestIdleHTTPConnectionsCannotLockOut(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	addr := p.addrs["http"]
	healthz := func(what string) {
		t.Helper()
		c := &http.Client{Timeout: mqtttest.Timeout}
		resp, err := c.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("/healthz after %s: %v", what, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz after %s: %s", what, resp.Status)
		}
	}
	idle := holdHTTP(t, addr, "127.0.0.2", 300, true)
	healthz("300 idle keep-alive connections from another address")
	// Past half its share, an address's idle connections are closed after
	// a second (not the server's two minutes): the newest one ends.
	last := idle[len(idle)-1]
	_ = last.SetReadDeadline(time.Now().Add(mqtttest.Timeout))
	if n, err := last.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("an idle keep-alive connection past half the address's share stayed open (%d, %v)", n, err)
	}
	holdHTTP(t, addr, "127.0.0.3", 300, false)
	healthz("300 silent connections from another address")
	holdHTTP(t, addr, "127.0.0.1", 300, true)
	healthz("300 idle keep-alive connections from the same address")
	for i := range 4 { // 4 x 64: every address at its share, 256 in all
		holdHTTP(t, addr, fmt.Sprintf("127.0.1.%d", i+1), 64, false)
	}
	healthz("256 silent connections from four addresses")
}

// login posts token to the console's login and returns the answer.
func login(t *testing.T, p *proc, token string) *http.Response {
	t.Helper()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.PostForm("http://"+p.addrs["http"]+"/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// apiStatus sends GET path with the headers given (name, value, ...).
func apiStatus(t *testing.T, p *proc, path string, header ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+p.addrs["http"]+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := (&http.Client{Timeout: mqtttest.Timeout}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestConsoleSessionsExpireAndEndAtLogout: the console's cookie is the id of
// a session the broker keeps: it expires (12 h) and logout ends it, so a
// copy of the cookie stops working. It was a fixed HMAC of the token, valid
// for ever, logout or not.
func TestConsoleSessionsExpireAndEndAtLogout(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--http-token", "0123456789abcdef-operator")
	resp := login(t, p, "0123456789abcdef-operator")
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == adminapi.SessionCookie {
			session = c
		}
	}
	if session == nil || session.MaxAge <= 0 || session.MaxAge > 12*3600 {
		t.Fatalf("login: %s, session cookie %+v: want one that expires within 12 h", resp.Status, session)
	}
	cookie := session.Name + "=" + session.Value
	if got := apiStatus(t, p, adminapi.PathOverview, "Cookie", cookie); got != http.StatusOK {
		t.Fatalf("with the session cookie: %d", got)
	}
	if again := login(t, p, "0123456789abcdef-operator"); len(again.Cookies()) == 0 || again.Cookies()[0].Value == session.Value {
		t.Fatal("a second login got the same cookie: it is not a session")
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.addrs["http"]+"/logout", nil)
	req.Header.Set("Cookie", cookie)
	out, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out.Body.Close()
	if got := apiStatus(t, p, adminapi.PathOverview, "Cookie", cookie); got != http.StatusUnauthorized {
		t.Fatalf("the cookie after logout: %d, want 401", got)
	}
}

// TestTokenGuessesAreSpacedNotLockingOut: wrong tokens, to the console's
// login or in bearer headers, are answered at most ten a second in all, so
// the token cannot be guessed at network speed (300 bearer guesses once took
// 2.3 s); the right one is never refused, from the guesser's own address
// too (a per-address lockout of the login once shut the operator out).
func TestTokenGuessesAreSpacedNotLockingOut(t *testing.T) {
	const token = "0123456789abcdef-operator"
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--http-token", token)
	for i := range 20 {
		if resp := login(t, p, fmt.Sprintf("guess-%d", i)); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong login %d: %s", i, resp.Status)
		}
	}
	if resp := login(t, p, token); resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) == 0 {
		t.Fatalf("the right token after 20 wrong ones from the same address: %s", resp.Status)
	}
	start := time.Now()
	for i := range 30 {
		if got := apiStatus(t, p, adminapi.PathOverview, "Authorization", fmt.Sprintf("Bearer guess-%d", i)); got != http.StatusUnauthorized {
			t.Fatalf("wrong bearer token %d: %d", i, got)
		}
	}
	if took := time.Since(start); took < 30*100*time.Millisecond { // a lower bound: a slow machine only adds to it
		t.Fatalf("30 wrong bearer tokens answered in %v, want at least 3 s", took)
	}
	// A flood of guesses from the operator's own address: the right token
	// still gets in, after the guesses queued ahead of it.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			c := &http.Client{Timeout: mqtttest.Timeout}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, "http://"+p.addrs["http"]+adminapi.PathOverview, nil)
				req.Header.Set("Authorization", fmt.Sprintf("Bearer flood-%d-%d", g, i))
				if resp, err := c.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	got := apiStatus(t, p, adminapi.PathOverview, "Authorization", "Bearer "+token)
	close(stop)
	wg.Wait()
	if got != http.StatusOK {
		t.Fatalf("the right bearer token during a flood of guesses: %d", got)
	}
}

type sse = mqtttest.SSE

// openSSE opens a topic stream of filter from local address ip, with the
// headers given; it returns the answer's status and its events (closed when
// the stream ends), and ends the stream when the test does.
func openSSE(t *testing.T, p *proc, ip, filter string, header ...string) (int, <-chan sse) {
	t.Helper()
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext}
	t.Cleanup(tr.CloseIdleConnections) // after the stream's cleanup
	resp, events := mqtttest.OpenSSE(t, &http.Client{Transport: tr}, "http://"+p.addrs["http"]+adminapi.PathTopicStream+"?"+url.Values{"filter": {filter}}.Encode(), 100, header...)
	return resp.StatusCode, events
}

// nextTopic returns the topic of the stream's next message event.
func nextTopic(t *testing.T, events <-chan sse) string {
	t.Helper()
	timeout := time.After(mqtttest.Timeout)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the stream ended")
			}
			if ev.Name == "message" {
				var m adminapi.TopicEvent
				if err := json.Unmarshal([]byte(ev.Data), &m); err != nil {
					t.Fatal(err)
				}
				return m.Topic
			}
		case <-timeout:
			t.Fatal("no message on the stream")
		}
	}
}

// TestTopicStreamObeysTheACL: with an auth ledger, the topic stream (the
// console's Topics page) shows what http-topic-user may read, is open to the
// token's holder, and is off without either; it once showed every topic,
// ACL-denied ones included, to any local process when no token was set.
func TestTopicStreamObeysTheACL(t *testing.T) {
	t.Run("off without a token or a topic user", func(t *testing.T) {
		p := startSecure(t, "")
		if status, _ := openSSE(t, p, "127.0.0.1", "#"); status != http.StatusForbidden {
			t.Fatalf("stream: %d, want 403", status)
		}
	})
	t.Run("the topic user's ACL", func(t *testing.T) {
		p := startSecure(t, "", "--http-topic-user", "device") // device may use sensors/# alone
		status, events := openSSE(t, p, "127.0.0.1", "#")
		if status != http.StatusOK {
			t.Fatalf("stream: %d", status)
		}
		admin := dialAs(t, p.addrs["tcp"], "admin-1", "admin", mqtttest.WorkerOptions{CleanStart: true})
		device := dialAs(t, p.addrs["tcp"], "device-1", "device", mqtttest.WorkerOptions{CleanStart: true})
		if rc, err := admin.Publish("admin/secret", []byte("plans"), 1); err != nil || rc != 0 {
			t.Fatalf("admin publish: %#x %v", rc, err)
		}
		if rc, err := device.Publish("sensors/1", []byte("21.5"), 1); err != nil || rc != 0 {
			t.Fatalf("device publish: %#x %v", rc, err)
		}
		if topic := nextTopic(t, events); topic != "sensors/1" {
			t.Fatalf("the stream showed %s, which device may not read", topic)
		}
	})
	t.Run("the token's holder", func(t *testing.T) {
		const token = "0123456789abcdef-operator"
		p := startSecure(t, "", "--http-token", token)
		if status, _ := openSSE(t, p, "127.0.0.1", "#", "Authorization", "Bearer "+token); status != http.StatusOK {
			t.Fatalf("stream with the token: %d", status)
		}
	})
}

// TestTopicStreamSlotsCannotBeHeld: idle viewers cannot keep the operator
// from watching: a stream past the eighth takes the place of the oldest
// stream of the address holding the most, which is told so. Eight idle
// viewers once held every slot (429 for the operator).
func TestTopicStreamSlotsCannotBeHeld(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false")
	var idle []<-chan sse
	for range 8 {
		status, events := openSSE(t, p, "127.0.0.2", "idle/#")
		if status != http.StatusOK {
			t.Fatalf("idle viewer: %d", status)
		}
		idle = append(idle, events)
	}
	status, events := openSSE(t, p, "127.0.0.1", "watched/#")
	if status != http.StatusOK {
		t.Fatalf("the operator's stream: %d, want 200", status)
	}
	for ev := range idle[0] {
		if ev.Name == "closed" {
			break
		}
	}
	pub := dialWorker(t, p.addrs["tcp"], "pub")
	if _, err := pub.Publish("watched/x", []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if topic := nextTopic(t, events); topic != "watched/x" {
		t.Fatalf("the operator's stream showed %s", topic)
	}
}

// memStatus returns fields of the broker's /proc status (in bytes); with
// reset, it first makes the current resident size the peak (clear_refs 5).
func memStatus(t *testing.T, p *proc, reset bool, fields ...string) []uint64 {
	t.Helper()
	if reset {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.cmd.Process.Pid), []byte("5"), 0); err != nil {
			t.Skipf("cannot reset the peak RSS: %v", err)
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint64, len(fields))
	for line := range strings.SplitSeq(string(b), "\n") {
		for i, f := range fields {
			if v, ok := strings.CutPrefix(line, f+":"); ok {
				kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				out[i] = kb << 10
			}
		}
	}
	return out
}

// TestDeadLetterPagesAreBounded: a page of dead letters (GET /api/v1/dlq)
// holds previews (a payload's first KiB), is written as it is read, and
// stops before 4 MiB; one letter comes whole from /api/v1/dlq/letter. A page
// of 100 dead letters of 1 MB once built 100 MB in memory (RSS 416 -> 1,058
// MB; up to 1,000 a page).
func TestDeadLetterPagesAreBounded(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--fsync=false", "--pprof")
	addr := p.addrs["tcp"]
	member := dialWorker(t, addr, "member")
	subscribeWorker(t, member, "$share/dlq/big/#")
	pub := dialWorker(t, addr, "pub")
	payload := []byte(strings.Repeat("x", 1_000_000))
	const n = 100
	for i := range n {
		publishKey(t, pub, fmt.Sprintf("big/%d", i), fmt.Sprint(i), string(payload))
		m := member.Next(mqtttest.Timeout)
		if m == nil {
			t.Fatalf("message %d not delivered", i)
		}
		if err := member.Nack(m, 0x87); err != nil { // dead-lettered at once
			t.Fatal(err)
		}
	}
	waitGroup(t, p, "dlq/big/#", "100 dead letters", func(v adminapi.GroupView) bool { return v.DeadLetters == n })
	before := sampleHeap(t, p)
	m0 := memStatus(t, p, true, "VmHWM", "RssFile")
	resp, err := http.Get("http://" + p.addrs["http"] + adminapi.PathDLQ + "?" + url.Values{"group": {"dlq/big/#"}, "limit": {"100"}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	var page adminapi.DeadLetterPage
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &page); err != nil {
		t.Fatalf("page: %v", err)
	}
	// The peak's growth less the data file's pages the read mapped in
	// (file-backed, and the same whatever the answer holds): what the
	// request built in memory.
	m1 := memStatus(t, p, false, "VmHWM", "RssFile")
	grew := int64(m1[0]-m0[0]) - (int64(m1[1]) - int64(m0[1]))
	after := sampleHeap(t, p) // what the answer left behind (its peak is in VmHWM)
	const bound = 32 << 20
	t.Logf("GET of 100 dead letters of 1 MB: %d bytes answered; peak RSS +%.1f MiB, of which file pages +%.1f MiB: +%.1f MiB built (bound %.0f MiB); heap %.1f MiB before, %.1f MiB after",
		len(raw), mib(m1[0]-m0[0]), float64(int64(m1[1])-int64(m0[1]))/(1<<20), float64(grew)/(1<<20), mib(bound), mib(before.heap), mib(after.heap))
	if len(page.DeadLetters) != n || page.More || page.Total != n {
		t.Fatalf("page: %d letters, more %v, total %d", len(page.DeadLetters), page.More, page.Total)
	}
	for _, l := range page.DeadLetters {
		if !l.Truncated || len(l.Payload) > adminapi.MaxPreviewBytes || l.PayloadSize != len(payload) {
			t.Fatalf("letter %d: truncated %v, %d bytes of %d", l.ID, l.Truncated, len(l.Payload), l.PayloadSize)
		}
	}
	if grew > bound {
		t.Fatalf("one page built %.1f MiB in the broker", float64(grew)/(1<<20))
	}
	c, err := adminapi.Dial(p.addrs["http"], "")
	if err != nil {
		t.Fatal(err)
	}
	whole, _, err := adminapi.Call(t.Context(), c, adminapi.DeadLetter("dlq/big/#", page.DeadLetters[0].ID))
	if err != nil || whole.Truncated || whole.Payload != string(payload) {
		t.Fatalf("one letter in full: truncated %v, %d bytes, %v", whole.Truncated, len(whole.Payload), err)
	}
}
