package conform

import (
	"bytes"
	"errors"
	"flag"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
)

var seed = flag.Uint64("conform.seed", 0, "seed of the random splits (0: from the clock)")

// The frames of the tests.
var (
	frame, props, u16, str = mqtttest.Frame, mqtttest.Props, mqtttest.U16, mqtttest.Str

	topicAlias  = mqtttest.PropU16(mqttwire.PropTopicAlias, 1)
	expiry      = mqtttest.PropU32(mqttwire.PropMessageExpiry, 60)
	reason      = mqtttest.PropString(mqttwire.PropReasonString, "why")
	subID       = []byte{mqttwire.PropSubscriptionID, 7}
	sessExpiry  = mqtttest.PropU32(mqttwire.PropSessionExpiry, 60)
	willDelay   = mqtttest.PropU32(mqttwire.PropWillDelay, 5)
	user        = mqtttest.PropUser("key", "k1")
	user2       = mqtttest.PropUser("key", "k2")
	connectOK   = mqtttest.Connect5("c1", props(sessExpiry, user, user2), props(willDelay, user))
	publishOK   = frame(mqttwire.TypePublish, 0x02, str("a/b"), u16(1), props(topicAlias, expiry, user, user2, user), []byte("payload"))
	pingreq     = frame(mqttwire.TypePingreq, 0)
	shortPuback = frame(mqttwire.TypePuback, 0, u16(1))
)

// goodFrames follow the rules (or are left to mochi) and all pass.
var goodFrames = [][]byte{
	publishOK, pingreq, shortPuback,
	frame(mqttwire.TypePuback, 0, u16(1), []byte{0x10}),                                       // reason code, no properties
	frame(mqttwire.TypePubrel, 2, u16(1), []byte{0}, props(reason, user, user)),               // properties once each
	frame(mqttwire.TypeSubscribe, 2, u16(2), props(subID, user, user), str("a/#"), []byte{1}), // one id, user properties repeat
	frame(mqttwire.TypeDisconnect, 0),
	frame(mqttwire.TypeDisconnect, 0, []byte{0x04}),
	frame(mqttwire.TypePublish, 0, str("a/b"), props(), make([]byte, 5000)), // a payload over several reads
	frame(mqttwire.TypePublish, 0, str("a/b"), []byte{5, 0x23}),             // a block cut short: malformed, mochi's
}

// outcome is what feeding a stream to a Checker gave.
type outcome struct {
	passed int // bytes passed, over every read
	reply  []byte
	err    error
}

// feed gives stream to c in reads of the sizes next returns.
func feed(t testing.TB, c *Checker, stream []byte, next func() int) outcome {
	var o outcome
	for len(stream) > 0 {
		n := min(max(1, next()), len(stream))
		pass, reply, err := c.Inspect(stream[:n])
		o.passed += pass
		if err != nil {
			o.reply, o.err = reply, err
			return o
		}
		if pass != n {
			t.Fatalf("Inspect passed %d of %d bytes without an error", pass, n)
		}
		stream = stream[n:]
	}
	return o
}

// splits returns the ways of reading a stream the tests try: whole, a byte
// at a time, mochi's 2 KiB, and random sizes.
func splits(t testing.TB) map[string]func() int {
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("random splits: -conform.seed=%d", s)
	rng := rand.New(rand.NewPCG(s, s))
	return map[string]func() int{
		"whole":  func() int { return 1 << 30 },
		"bytes":  func() int { return 1 },
		"2KiB":   func() int { return 2048 },
		"random": func() int { return 1 + rng.IntN(40) },
	}
}

// TestCheckerRefusesBadFrames: a frame of each kind a client sends with a
// property twice, and CONNECTs with Receive Maximum or Maximum Packet Size 0.
func TestCheckerRefusesBadFrames(t *testing.T) {
	for _, bad := range mqtttest.ProtocolErrors() {
		var stream []byte
		if !bad.IsConnect() {
			stream = slices.Concat(connectOK, slices.Concat(goodFrames...))
		}
		start := len(stream)
		stream = slices.Concat(stream, bad.Frame, publishOK)
		for how, next := range splits(t) {
			o := feed(t, NewChecker(1<<20), stream, next)
			if !errors.Is(o.err, ErrProtocol) || !strings.HasSuffix(o.err.Error(), ": "+bad.Reason) {
				t.Fatalf("%s, read %s: error %v, want %q", bad.Name, how, o.err, bad.Reason)
			}
			// Every frame before the bad one passes, the bad one never whole.
			if o.passed < start || o.passed >= start+len(bad.Frame) {
				t.Fatalf("%s, read %s: passed %d bytes; the bad frame is bytes %d to %d", bad.Name, how, o.passed, start, start+len(bad.Frame))
			}
			typ, body := mqttwire.TypeDisconnect, []byte{0x82}
			if start == 0 {
				typ, body = mqttwire.TypeConnack, []byte{0, 0x82}
			}
			body = append(body, props(mqtttest.PropString(mqttwire.PropReasonString, bad.Reason))...)
			if want := frame(typ, 0, body); !bytes.Equal(o.reply, want) {
				t.Fatalf("%s, read %s: reply % x, want % x", bad.Name, how, o.reply, want)
			}
		}
	}
}

func TestCheckerPassesGoodFrames(t *testing.T) {
	stream := slices.Concat(connectOK, slices.Concat(goodFrames...), connectOK) // a second CONNECT is mochi's to refuse
	for how, next := range splits(t) {
		c := NewChecker(1 << 20)
		if o := feed(t, c, stream, next); o.err != nil || o.passed != len(stream) {
			t.Fatalf("read %s: %+v", how, o)
		}
		if c.state != checking || c.skip != 0 || c.need != 0 {
			t.Fatalf("read %s: checker lost its place: %+v", how, c)
		}
	}
}

// TestCheckerMQTT311 shows a 3.1.1 stream passing untouched after CONNECT:
// it has no properties, so bytes that would be duplicates in MQTT 5 are not.
func TestCheckerMQTT311(t *testing.T) {
	connect := mqttwire.AppendConnect(nil, &mqttwire.Connect{Version: mqttwire.Version311, ClientID: "d1", CleanStart: true})
	stream := slices.Concat(connect, frame(mqttwire.TypePublish, 0, str("a/b"), props(topicAlias, topicAlias)))
	c := NewChecker(1 << 20)
	if o := feed(t, c, stream, func() int { return 3 }); o.err != nil || o.passed != len(stream) || c.state != passing {
		t.Fatalf("%+v, state %d", o, c.state)
	}
}

// TestCheckerUnchecked: streams that mochi refuses pass unchecked.
func TestCheckerUnchecked(t *testing.T) {
	dup := frame(mqttwire.TypePublish, 0, str("a/b"), props(topicAlias, topicAlias))
	for name, stream := range map[string][]byte{
		"first frame not CONNECT":           slices.Concat(publishOK, dup),
		"fixed header over five bytes":      slices.Concat(connectOK, []byte{0x30, 0xff, 0xff, 0xff, 0xff, 0x7f}, dup),
		"property block past the frame end": slices.Concat(connectOK, frame(mqttwire.TypePublish, 0, str("a/b"), []byte{9}, topicAlias, topicAlias)),
		"QoS 3":                             slices.Concat(connectOK, frame(mqttwire.TypePublish, 0x06, str("a/b"), u16(1), props(topicAlias, topicAlias))),
	} {
		for how, next := range splits(t) {
			if o := feed(t, NewChecker(1<<20), stream, next); o.err != nil || o.passed != len(stream) {
				t.Errorf("%s, read %s: %+v", name, how, o)
			}
		}
	}
}

// TestCheckerBuffersWithinTheLimit: a frame over the size limit is never
// buffered (mochi refuses it by its header), and a head that arrives a byte
// at a time is held once, within the limit, and let go when it is large.
func TestCheckerBuffersWithinTheLimit(t *testing.T) {
	const limit = 1000
	big := frame(mqttwire.TypePublish, 0, str(strings.Repeat("t", limit)), props(topicAlias, topicAlias))
	c := NewChecker(limit)
	o := feed(t, c, slices.Concat(connectOK, big), func() int { return 1 })
	if o.err != nil || cap(c.head) > 64 {
		t.Fatalf("a frame over the limit: %+v, buffered %d bytes", o, cap(c.head))
	}
	within := frame(mqttwire.TypePublish, 0, str(strings.Repeat("t", limit-20)), props(topicAlias))
	c = NewChecker(limit)
	peak := 0
	stream := slices.Concat(connectOK, within, publishOK)
	for i := range stream {
		if _, _, err := c.Inspect(stream[i : i+1]); err != nil {
			t.Fatal(err)
		}
		peak = max(peak, cap(c.head))
	}
	if peak < limit-20 || peak > 2*limit || cap(c.head) > keptHead {
		t.Fatalf("head buffer: peak %d bytes (want about the %d-byte head), kept %d", peak, len(within), cap(c.head))
	}
}

// TestCheckerReplyFitsTheClient: a Reason String that would take the reply
// past the client's Maximum Packet Size is left out.
func TestCheckerReplyFitsTheClient(t *testing.T) {
	connect := mqtttest.Connect5("c1", props(mqtttest.PropU32(mqttwire.PropMaximumPacketSize, 20)), nil)
	stream := slices.Concat(connect, frame(mqttwire.TypePublish, 0, str("a/b"), props(topicAlias, topicAlias)))
	c := NewChecker(0)
	o := feed(t, c, stream, func() int { return 1 << 30 })
	if want := []byte{0xe0, 2, 0x82, 0}; !bytes.Equal(o.reply, want) || o.err == nil {
		t.Fatalf("reply % x (%v), want % x", o.reply, o.err, want)
	}
	// A Checker that has failed repeats its error, without a reply.
	if pass, reply, err := c.Inspect(pingreq); pass != 0 || reply != nil || err != o.err {
		t.Fatalf("after the error: %d %x %v", pass, reply, err)
	}
}

func TestConnack311(t *testing.T) {
	want := map[byte]byte{0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 0x80: 3, 0x84: 1, 0x85: 2, 0x86: 4, 0x87: 5, 0x88: 3, 0x89: 3, 0x8a: 5, 0x97: 3}
	for code := range 256 {
		rc, send := Connack311(byte(code))
		switch {
		case code == 0x81 || code == 0x82:
			if send {
				t.Errorf("0x%02x: a malformed CONNECT gets no CONNACK in 3.1.1", code)
			}
		case !send || rc > Return311NotAuthorized:
			t.Errorf("0x%02x -> 0x%02x, send %v: want a 3.1.1 return code", code, rc, send)
		}
		if w, ok := want[byte(code)]; ok && rc != w {
			t.Errorf("0x%02x -> 0x%02x, want 0x%02x", code, rc, w)
		}
	}
}

// FuzzChecker: no stream makes Inspect panic, and how a stream is split
// into reads never changes the verdict.
func FuzzChecker(f *testing.F) {
	f.Add(slices.Concat(connectOK, slices.Concat(goodFrames...)), uint64(1))
	for _, bad := range mqtttest.ProtocolErrors() {
		f.Add(slices.Concat(connectOK, bad.Frame), uint64(2))
	}
	f.Fuzz(func(t *testing.T, stream []byte, s uint64) {
		whole := feed(t, NewChecker(4096), stream, func() int { return 1 << 30 })
		rng := rand.New(rand.NewPCG(s, s))
		split := feed(t, NewChecker(4096), stream, func() int { return 1 + rng.IntN(8) })
		if (whole.err == nil) != (split.err == nil) || whole.err != nil && whole.err.Error() != split.err.Error() || !bytes.Equal(whole.reply, split.reply) {
			t.Fatalf("whole: %+v; split: %+v", whole, split)
		}
		if whole.err != nil && (split.passed < whole.passed || split.passed > len(stream)) {
			t.Fatalf("whole passed %d bytes, split %d", whole.passed, split.passed)
		}
	})
}
