package main

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"
)

// decodeWithMochi parses one frame with mochi's own decoder.
func decodeWithMochi(t *testing.T, frame []byte, proto byte) packets.Packet {
	t.Helper()
	var fh packets.FixedHeader
	if err := fh.Decode(frame[0]); err != nil {
		t.Fatalf("fixed header: %v", err)
	}
	rl, n, err := packets.DecodeLength(bytes.NewReader(frame[1:]))
	if err != nil {
		t.Fatalf("length: %v", err)
	}
	if 1+n+rl != len(frame) {
		t.Fatalf("frame is %d bytes, header says %d", len(frame), 1+n+rl)
	}
	fh.Remaining = rl
	pk := packets.Packet{FixedHeader: fh, ProtocolVersion: proto}
	body := frame[1+n:]
	switch fh.Type {
	case packets.Connect:
		err = pk.ConnectDecode(body)
	case packets.Subscribe:
		err = pk.SubscribeDecode(body)
	case packets.Publish:
		err = pk.PublishDecode(body)
	case packets.Puback:
		err = pk.PubackDecode(body)
	case packets.Pubrec:
		err = pk.PubrecDecode(body)
	case packets.Pubrel:
		err = pk.PubrelDecode(body)
	case packets.Pubcomp:
		err = pk.PubcompDecode(body)
	case packets.Disconnect:
		err = pk.DisconnectDecode(body)
	case packets.Pingreq:
		err = pk.PingreqDecode(body)
	default:
		t.Fatalf("unexpected type %d", fh.Type)
	}
	if err != nil {
		t.Fatalf("mochi decode of type %d: %v", fh.Type, err)
	}
	return pk
}

func TestEncodeDecodedByMochi(t *testing.T) {
	for _, proto := range []byte{4, 5} {
		pk := decodeWithMochi(t, appendConnect(nil, proto, "client-1", 30), proto)
		if pk.Connect.ClientIdentifier != "client-1" || pk.Connect.Keepalive != 30 || !pk.Connect.Clean || pk.ProtocolVersion != proto {
			t.Errorf("proto %d CONNECT decoded as %+v", proto, pk.Connect)
		}
		if code := pk.ConnectValidate(); code != packets.CodeSuccess {
			t.Errorf("proto %d CONNECT invalid: %v", proto, code)
		}

		pk = decodeWithMochi(t, appendSubscribe(nil, proto, 7, "$share/g/a/+", 1), proto)
		if pk.PacketID != 7 || len(pk.Filters) != 1 || pk.Filters[0].Filter != "$share/g/a/+" || pk.Filters[0].Qos != 1 {
			t.Errorf("proto %d SUBSCRIBE decoded as id %d %+v", proto, pk.PacketID, pk.Filters)
		}

		for qos := byte(0); qos <= 2; qos++ {
			key := ""
			if proto == 5 {
				key = "k42"
			}
			frame, off := appendPublish(nil, proto, "bench/x", qos, 513, key, 40)
			if len(frame) != publishLen(proto, "bench/x", qos, key, 40) {
				t.Fatalf("publishLen %d, frame %d", publishLen(proto, "bench/x", qos, key, 40), len(frame))
			}
			putPayload(frame[off:], payloadInfo{run: 9, pub: 3, ts: 12345, seq: 77, key: 42, keySeq: 5})
			pk = decodeWithMochi(t, frame, proto)
			if pk.TopicName != "bench/x" || pk.FixedHeader.Qos != qos || len(pk.Payload) != 40 {
				t.Fatalf("proto %d qos %d PUBLISH decoded as %q qos %d payload %d", proto, qos, pk.TopicName, pk.FixedHeader.Qos, len(pk.Payload))
			}
			if qos > 0 && pk.PacketID != 513 {
				t.Errorf("packet id %d", pk.PacketID)
			}
			if proto == 5 && (len(pk.Properties.User) != 1 || pk.Properties.User[0].Key != "key" || pk.Properties.User[0].Val != "k42") {
				t.Errorf("user properties %+v", pk.Properties.User)
			}
			got, ok := getPayload(pk.Payload)
			if !ok || got != (payloadInfo{run: 9, pub: 3, ts: 12345, seq: 77, key: 42, keySeq: 5}) {
				t.Errorf("payload %+v", got)
			}
		}
		for _, typ := range []byte{pktPuback, pktPubrec, pktPubrel, pktPubcomp} {
			pk = decodeWithMochi(t, appendAck(nil, typ, 65535), proto)
			if pk.PacketID != 65535 || pk.FixedHeader.Type != typ {
				t.Errorf("ack type %d decoded as %d id %d", typ, pk.FixedHeader.Type, pk.PacketID)
			}
		}
		decodeWithMochi(t, appendDisconnect(nil), proto)
		decodeWithMochi(t, appendPingreq(nil), proto)
	}
}

// encodeWithMochi returns mochi's encoding of pk.
func encodeWithMochi(t *testing.T, pk packets.Packet) []byte {
	t.Helper()
	var buf bytes.Buffer
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connack:
		err = pk.ConnackEncode(&buf)
	case packets.Suback:
		err = pk.SubackEncode(&buf)
	case packets.Publish:
		err = pk.PublishEncode(&buf)
	case packets.Puback:
		err = pk.PubackEncode(&buf)
	}
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecodeMochiFrames(t *testing.T) {
	payload := make([]byte, 48)
	putPayload(payload, payloadInfo{run: 1, pub: 2, ts: 3, seq: 4, key: 5, keySeq: 6})
	var stream []byte
	pub := packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: 5,
		TopicName: "bench/shared", PacketID: 9, Payload: payload,
		Properties: packets.Properties{
			MessageExpiryInterval: 60, ContentType: "bin", CorrelationData: []byte{1, 2},
			SubscriptionIdentifier: []int{300},
			User:                   []packets.UserProperty{{Key: "other", Val: "x"}, {Key: "key", Val: "k5"}},
		},
	}
	stream = append(stream, encodeWithMochi(t, pub)...)
	stream = append(stream, encodeWithMochi(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack},
		ProtocolVersion: 5, Properties: packets.Properties{ReceiveMaximum: 321, TopicAliasMaximum: 10}})...)
	stream = append(stream, encodeWithMochi(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Suback},
		ProtocolVersion: 5, PacketID: 4, ReasonCodes: []byte{1}})...)
	big := pub
	big.Payload = bytes.Repeat([]byte{'z'}, 5000) // larger than the reader's buffer
	big.Properties = packets.Properties{}
	stream = append(stream, encodeWithMochi(t, big)...)
	stream = append(stream, encodeWithMochi(t, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback},
		ProtocolVersion: 5, PacketID: 11, ReasonCode: 0x97})...)

	// A reader that returns one byte at a time exercises every partial-read path.
	fr := newFrameReader(iotestOneByte{bytes.NewReader(stream)}, 1024)

	p, err := fr.next()
	if err != nil || p.typ != pktPublish {
		t.Fatalf("first packet %d %v", p.typ, err)
	}
	m, err := decodePublish(p, 5)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.topic) != "bench/shared" || m.qos != 1 || m.id != 9 || !m.hasKey || string(m.keyProp) != "k5" {
		t.Fatalf("publish %+v", m)
	}
	if pi, ok := getPayload(m.payload); !ok || pi.keySeq != 6 || len(m.payload) != 48 {
		t.Fatalf("payload %+v", pi)
	}

	p, err = fr.next()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := decodeConnack(p, 5)
	if err != nil || ca.code != 0 || ca.receiveMaximum != 321 {
		t.Fatalf("connack %+v %v", ca, err)
	}

	p, err = fr.next()
	if err != nil {
		t.Fatal(err)
	}
	id, codes, err := decodeSuback(p, 5)
	if err != nil || id != 4 || !bytes.Equal(codes, []byte{1}) {
		t.Fatalf("suback %d %x %v", id, codes, err)
	}

	p, err = fr.next()
	if err != nil {
		t.Fatal(err)
	}
	m, err = decodePublish(p, 5)
	if err != nil || len(m.payload) != 5000 || m.hasKey {
		t.Fatalf("big publish: %d bytes, key %v, %v", len(m.payload), m.hasKey, err)
	}

	p, err = fr.next()
	if err != nil {
		t.Fatal(err)
	}
	if id, rc, err := ackID(p); err != nil || p.typ != pktPuback || id != 11 || rc != 0x97 {
		t.Fatalf("puback %d %d %x %v", p.typ, id, rc, err)
	}
	if _, err := fr.next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
}

type iotestOneByte struct{ r io.Reader }

func (o iotestOneByte) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

func TestMalformed(t *testing.T) {
	for name, in := range map[string][]byte{
		"length over 4 bytes": {0x30, 0xff, 0xff, 0xff, 0xff, 0x01},
		"truncated":           {0x30, 0x05, 0x00},
	} {
		fr := newFrameReader(bytes.NewReader(in), 64)
		if _, err := fr.next(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := decodePublish(packet{typ: pktPublish, body: []byte{0, 9, 'a'}}, 4); err == nil {
		t.Error("topic longer than the body accepted")
	}
	if _, err := decodePublish(packet{typ: pktPublish, body: []byte{0, 1, 'a', 3, 0x77, 0, 0}}, 5); err == nil {
		t.Error("unknown property accepted")
	}
}

func TestVarint(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 16383, 16384, 2097151, 2097152, 268435455} {
		b := appendVarint(nil, n)
		if len(b) != varintLen(n) {
			t.Errorf("%d: %d bytes, varintLen %d", n, len(b), varintLen(n))
		}
		got, used := readVarint(b)
		if got != n || used != len(b) {
			t.Errorf("%d: read back %d (%d bytes)", n, got, used)
		}
	}
}

func TestHistogram(t *testing.T) {
	var h hist
	for v := int64(1); v <= 100000; v++ {
		h.record(v * 1000) // 1 µs .. 100 ms
	}
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.5, 50e6}, {0.9, 90e6}, {0.99, 99e6}} {
		got := float64(h.quantile(c.q))
		if got < c.want*0.99 || got > c.want*1.01 {
			t.Errorf("q%.2f = %.0f, want %.0f within 1%%", c.q, got, c.want)
		}
	}
	if h.quantile(1) != 100000*1000 || h.max != 100000*1000 {
		t.Errorf("max %d / q1 %d", h.max, h.quantile(1))
	}
	var o hist
	o.record(5)
	o.merge(&h)
	if o.n != h.n+1 || o.quantile(0) != 5 {
		t.Errorf("merge: n %d min %d", o.n, o.quantile(0))
	}
	for i := 128; i < 64*56; i++ { // up to values of 2^55 ns
		if histIndex(histValue(i)) != i {
			t.Fatalf("bucket %d: value %d maps to %d", i, histValue(i), histIndex(histValue(i)))
		}
	}
}

func TestOrderChecker(t *testing.T) {
	c := newOrderChecker(3, 70)
	// key 0 in order on consumer 0
	for s := uint32(1); s <= 100; s++ {
		if dup, viol := c.observe(0, s, 0); dup || viol {
			t.Fatalf("in-order seq %d flagged", s)
		}
	}
	// key 1: 1 2 4 3 3 5, seen by consumers 1 and 69
	var dups, viols int
	for i, s := range []uint32{1, 2, 4, 3, 3, 5} {
		dup, viol := c.observe(1, s, []int{1, 69}[i%2])
		if dup {
			dups++
		}
		if viol {
			viols++
		}
	}
	if dups != 1 || viols != 1 {
		t.Fatalf("key 1: %d duplicates, %d violations; want 1, 1", dups, viols)
	}
	// key 2: only seq 1 and 3 (2 missing); a huge sequence grows the bitset
	c.observe(2, 1, 2)
	c.observe(2, 3, 2)
	c.observe(2, 5000, 2)
	c.observe(7, 1, 0) // unknown key: ignored
	r := c.result(100 + 5 + 5000)
	if r.Unique != 100+5+3 || r.Duplicates != 1 || r.OrderViolations != 1 || r.KeysWithViolations != 1 {
		t.Errorf("result %+v", r)
	}
	if r.Missing != 5000-3 {
		t.Errorf("missing %d", r.Missing)
	}
	if r.KeysOnSeveralConsumers != 1 || r.KeysSeen != 3 || r.KeysPerConsumerMin != 0 || r.KeysPerConsumerMax != 1 {
		t.Errorf("spread %+v", r)
	}
}

// TestOrderCheckerCatchesRoundRobin simulates both dispatch policies with a
// deterministic interleaving of consumers that process at different speeds:
// sticky key-to-consumer dispatch (Key-Shared) keeps per-key order, a
// round-robin dispatch (mosquitto's $share) does not, and the checker says so.
func TestOrderCheckerCatchesRoundRobin(t *testing.T) {
	const keys, consumers, msgs = 16, 4, 4000
	simulate := func(pick func(i int, key uint32) int) orderJSON {
		c := newOrderChecker(keys, consumers)
		queues := make([][][2]uint32, consumers)
		seq := make([]uint32, keys)
		rng := uint64(88172645463325252)
		for i := 0; i < msgs; i++ {
			rng ^= rng << 13
			rng ^= rng >> 7
			rng ^= rng << 17
			k := uint32(rng % keys)
			seq[k]++
			q := pick(i, k)
			queues[q] = append(queues[q], [2]uint32{k, seq[k]})
		}
		// Consumer j processes j+1 messages per turn: unequal speeds.
		for done := false; !done; {
			done = true
			for j := range queues {
				for n := 0; n <= j && len(queues[j]) > 0; n++ {
					m := queues[j][0]
					queues[j] = queues[j][1:]
					c.observe(m[0], m[1], j)
				}
				if len(queues[j]) > 0 {
					done = false
				}
			}
		}
		return c.result(msgs)
	}
	sticky := simulate(func(_ int, k uint32) int { return int(k) % consumers })
	if sticky.OrderViolations != 0 || sticky.KeysOnSeveralConsumers != 0 || sticky.Missing != 0 {
		t.Errorf("sticky dispatch: %+v", sticky)
	}
	rr := simulate(func(i int, _ uint32) int { return i % consumers })
	if rr.OrderViolations == 0 || rr.KeysOnSeveralConsumers != keys || rr.Missing != 0 || rr.Duplicates != 0 {
		t.Errorf("round-robin dispatch: %+v", rr)
	}
}

func TestParseFlags(t *testing.T) {
	var errs strings.Builder
	for _, bad := range [][]string{
		{"-scenario", "nope"},
		{"-proto", "3"},
		{"-payload", "8"},
		{"-scenario", "shared", "-key-mode", "nope"},
		{"-scenario", "fanin", "-stalled", "2"},
		{"extra"},
	} {
		if _, err := parseFlags(bad, &errs); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	cfg, err := parseFlags([]string{"-scenario", "shared"}, &errs)
	if err != nil || cfg.qos != 1 || cfg.proto != 5 {
		t.Errorf("shared defaults: %+v %v", cfg, err)
	}
	cfg, err = parseFlags([]string{"-scenario", "slowsub"}, &errs)
	if err != nil || cfg.stalled != 1 || cfg.qos != 0 {
		t.Errorf("slowsub defaults: %+v %v", cfg, err)
	}
}

// startMochi serves plain mochi on 127.0.0.1:0 for the test's lifetime.
func startMochi(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := mqtt.New(&mqtt.Options{Logger: slog.New(slog.DiscardHandler)})
	if err := s.AddHook(new(auth.AllowHook), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.AddListener(listeners.NewNet("t", ln)); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return ln.Addr().String()
}

func runArgs(t *testing.T, args ...string) *result {
	t.Helper()
	var errs strings.Builder
	cfg, err := parseFlags(args, &errs)
	if err != nil {
		t.Fatal(err)
	}
	res := runScenario(cfg, args)
	if !res.OK {
		t.Fatalf("%v: errors %v", args, res.Errors)
	}
	return res
}

func TestScenariosAgainstMochi(t *testing.T) {
	addr := startMochi(t)
	short := []string{"-addr", addr, "-warmup", "100ms", "-duration", "300ms", "-drain", "3s"}

	r := runArgs(t, append(short, "-scenario", "fanout", "-subs", "3", "-topics", "2", "-pubs", "2")...)
	if r.Expected == 0 || r.Delivered != r.Expected || r.Gaps != 0 || r.Reorders != 0 || r.Latency.Count != r.Delivered {
		t.Errorf("fanout: expected %d delivered %d gaps %d reorders %d latency count %d", r.Expected, r.Delivered, r.Gaps, r.Reorders, r.Latency.Count)
	}
	if r.CPU.Loadgen <= 0 {
		t.Errorf("fanout: no CPU measured: %+v", r.CPU)
	}

	r = runArgs(t, "-addr", addr, "-scenario", "fanout", "-subs", "4", "-pubs", "2", "-count", "500", "-qos", "1", "-duration", "20s")
	if r.PublishedAll != 1000 || r.Published != 1000 || r.Expected != 4000 || r.Delivered != 4000 || r.Gaps != 0 {
		t.Errorf("fanout -count: published %d/%d expected %d delivered %d gaps %d", r.Published, r.PublishedAll, r.Expected, r.Delivered, r.Gaps)
	}

	// Keep-alive pings (every 500 ms here) must not disturb a run.
	r = runArgs(t, "-addr", addr, "-scenario", "fanout", "-subs", "2", "-qos", "1", "-keepalive", "1", "-rate", "2000", "-warmup", "0s", "-duration", "1200ms")
	if r.Delivered != r.Expected || r.Expected == 0 {
		t.Errorf("fanout with keep-alive: expected %d delivered %d", r.Expected, r.Delivered)
	}

	r = runArgs(t, append(short, "-scenario", "fanout", "-subs", "2", "-qos", "2", "-proto", "4")...)
	if r.Delivered != r.Expected || r.Expected == 0 || r.PubNacks != 0 {
		t.Errorf("fanout qos 2: expected %d delivered %d nacks %d", r.Expected, r.Delivered, r.PubNacks)
	}

	for _, mode := range []string{"prop", "topic"} {
		r = runArgs(t, append(short, "-scenario", "shared", "-consumers", "3", "-keys", "10", "-key-mode", mode, "-pubs", "2")...)
		o := r.Order
		if o == nil || o.Missing != 0 || o.Duplicates != 0 || o.Unique != r.PublishedAll || o.KeysSeen != 10 || r.KeyPropMissing != 0 {
			t.Errorf("shared %s: %+v published %d key prop missing %d", mode, o, r.PublishedAll, r.KeyPropMissing)
		}
		if len(r.MsgsPerConsumer) != 3 {
			t.Errorf("shared %s: per consumer %v", mode, r.MsgsPerConsumer)
		}
	}

	r = runArgs(t, append(short, "-scenario", "fanin", "-pubs", "5", "-subs", "2", "-group")...)
	if r.DeliveredAll != r.PublishedAll || r.PublishedAll == 0 {
		t.Errorf("fanin group: published %d delivered %d", r.PublishedAll, r.DeliveredAll)
	}

	r = runArgs(t, append(short, "-scenario", "slowsub", "-subs", "2", "-rate", "2000")...)
	if r.Stalled != 1 || r.Delivered == 0 {
		t.Errorf("slowsub: %+v", r)
	}

	r = runArgs(t, "-addr", addr, "-scenario", "connections", "-conns", "50", "-settle", "0s")
	if c := r.Connections; c == nil || c.Opened != 50 || c.Alive != 50 || c.ConnectPerS <= 0 {
		t.Errorf("connections: %+v", r.Connections)
	}
}

func TestPingNoBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	var out, errs strings.Builder
	if code := realMain([]string{"ping", "-addr", addr, "-timeout", "300ms"}, &out, &errs); code != 1 {
		t.Fatalf("ping of a closed port exited %d: %s", code, errs.String())
	}
	if !strings.Contains(errs.String(), "no MQTT broker") {
		t.Errorf("stderr %q", errs.String())
	}
}

func TestNullBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nb := &nullBroker{topics: map[string][]*nullConn{}}
	done := make(chan struct{})
	go func() { nb.serve(ln); close(done) }()
	t.Cleanup(func() { ln.Close(); <-done })
	for _, proto := range []string{"4", "5"} {
		r := runArgs(t, "-addr", ln.Addr().String(), "-proto", proto, "-scenario", "fanout", "-subs", "5", "-topics", "2",
			"-warmup", "100ms", "-duration", "300ms", "-drain", "3s")
		if r.Expected == 0 || r.Delivered != r.Expected || r.Gaps != 0 || r.Reorders != 0 {
			t.Errorf("proto %s: expected %d delivered %d gaps %d reorders %d", proto, r.Expected, r.Delivered, r.Gaps, r.Reorders)
		}
	}
}
