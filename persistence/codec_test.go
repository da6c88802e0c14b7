package persistence

import (
	"errors"
	"flag"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence/seglog"
)

var codecSeed = flag.Uint64("codec.seed", 0, "seed for TestCodecRoundTrip (0: from the clock)")

func randString(r *rand.Rand, n int) string {
	const alphabet = "abc/+#$ üж🚀\x01\n"
	rs := []rune(alphabet)
	out := make([]rune, r.IntN(n+1))
	for i := range out {
		out[i] = rs[r.IntN(len(rs))]
	}
	return string(out)
}

func randMessage(r *rand.Rand) keyshared.Message {
	m := keyshared.Message{
		Topic: randString(r, 20),
		QoS:   byte(r.IntN(3)),
	}
	if r.IntN(2) == 0 {
		m.Key = m.Topic
	} else {
		m.Key = randString(r, 10)
	}
	if n := r.IntN(300); n > 0 {
		m.Payload = make([]byte, n)
		for i := range m.Payload {
			m.Payload[i] = byte(r.Uint32())
		}
	}
	if r.IntN(3) == 0 {
		m.Props.PayloadFormat, m.Props.PayloadFormatSet = byte(r.IntN(2)), true
	}
	if r.IntN(2) == 0 {
		m.Props.ContentType = randString(r, 5)
		m.Props.ResponseTopic = randString(r, 5)
		if n := r.IntN(4); n > 0 {
			m.Props.CorrelationData = []byte(randString(r, n))
		}
		for range r.IntN(4) {
			m.Props.User = append(m.Props.User, keyshared.UserProperty{Key: randString(r, 4), Val: randString(r, 4)})
		}
	}
	if r.IntN(4) > 0 {
		m.PublishedAt = time.Unix(r.Int64N(4_000_000_000), r.Int64N(1e9))
	}
	if r.IntN(2) == 0 {
		m.ExpiresAt = time.Unix(r.Int64N(4_000_000_000), r.Int64N(1e9))
	}
	return m
}

func TestCodecRoundTrip(t *testing.T) {
	seed := *codecSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -codec.seed=%d)", seed, seed)
	r := rand.New(rand.NewPCG(seed, 0))
	for i := range 2000 {
		m := randMessage(r)
		enc := encodeMessage(&m)
		if len(enc) != messageSize(&m) {
			t.Fatalf("message %d: encoded %d bytes, messageSize says %d", i, len(enc), messageSize(&m))
		}
		got, err := decodeMessage(enc, false)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if d := sameMessage(got, m, 0); d != "" {
			t.Fatalf("message %d: %s", i, d)
		}
		d := keyshared.DeadLetter{Message: m, Attempts: r.IntN(100), Reason: byte(r.Uint32()),
			FirstDelivery: m.PublishedAt, LastDelivery: m.ExpiresAt, DeadAt: time.Unix(r.Int64N(1e9), 1)}
		d.Message.Offset = r.Uint64()
		denc := appendDeadLetter(nil, &d)
		gd, msgEnc, err := decodeDeadLetter(denc, false)
		if err != nil {
			t.Fatalf("dead letter %d: %v", i, err)
		}
		if string(msgEnc) != string(enc) {
			t.Fatalf("dead letter %d: embedded message differs from its encoding", i)
		}
		if gd.Attempts != d.Attempts || gd.Reason != d.Reason || !gd.FirstDelivery.Equal(d.FirstDelivery) ||
			!gd.LastDelivery.Equal(d.LastDelivery) || !gd.DeadAt.Equal(d.DeadAt) {
			t.Fatalf("dead letter %d: got %+v want %+v", i, gd, d)
		}
		if diff := sameMessage(gd.Message, m, d.Message.Offset); diff != "" {
			t.Fatalf("dead letter %d message: %s", i, diff)
		}
		// Every truncation fails cleanly (or, cut inside the payload, decodes).
		for n := range enc {
			if _, err := decodeMessage(enc[:n], false); err != nil && !errors.Is(err, errDecode) {
				t.Fatalf("message %d cut at %d: %v", i, n, err)
			}
		}
	}
}

func TestStateRoundTrip(t *testing.T) {
	st := groupState{lastSeen: time.Now().UnixNano(), active: true}
	st.Head, st.Cursor, st.Dropped = 1<<40, 1<<40-100, 7
	st.Resolved = []seglog.Range{{First: 1<<40 - 98, Last: 1<<40 - 90}, {First: 1<<40 - 10, Last: 1<<40 - 10}, {First: 1<<40 - 5, Last: 1 << 40}}
	got, err := decodeState(st.encode())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, st) {
		t.Fatalf("got %+v want %+v", got, st)
	}
	bad := []groupState{}
	add := func(head, cursor uint64, rs ...seglog.Range) {
		var b groupState
		b.Head, b.Cursor, b.Resolved = head, cursor, rs
		bad = append(bad, b)
	}
	add(3, 4)                                                                    // cursor past head
	add(10, 2, seglog.Range{First: 3, Last: 4})                                  // a range adjacent to the cursor
	add(10, 2, seglog.Range{First: 5, Last: 11})                                 // past the head
	add(10, 2, seglog.Range{First: 5, Last: 6}, seglog.Range{First: 7, Last: 8}) // adjacent ranges
	for _, b := range bad {
		if _, err := decodeState(b.encode()); !errors.Is(err, errDecode) {
			t.Errorf("decodeState(%+v) = %v, want errDecode", b, err)
		}
	}
	for n := range st.encode() {
		if _, err := decodeState(st.encode()[:n]); !errors.Is(err, errDecode) {
			t.Fatalf("state cut at %d: %v", n, err)
		}
	}
	d := dlqState{count: 3, seq: 9}
	if got, err := decodeDLQState(d.encode()); err != nil || got != d {
		t.Fatalf("dlq state %+v, %v", got, err)
	}
	if _, err := decodeDLQState(dlqState{count: 4, seq: 3}.encode()); !errors.Is(err, errDecode) {
		t.Fatalf("more dead letters than ids: %v", err)
	}
}

func FuzzDecodeMessage(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		m := randMessage(r)
		f.Add(encodeMessage(&m))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0xff, 2, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeMessage(data, false)
		if _, _, derr := decodeDeadLetter(data, false); derr != nil && !errors.Is(derr, errDecode) {
			t.Fatalf("decodeDeadLetter: unexpected error %v", derr)
		}
		if err != nil {
			if !errors.Is(err, errDecode) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		// What decodes re-encodes to something that decodes to the same message.
		again, err := decodeMessage(encodeMessage(&m), false)
		if err != nil {
			t.Fatalf("re-encoding of a decoded message does not decode: %v", err)
		}
		if d := sameMessage(again, m, 0); d != "" {
			t.Fatal(d)
		}
	})
}
