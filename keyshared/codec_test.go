package keyshared

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
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

func randMessage(r *rand.Rand) Message {
	m := Message{
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
			m.Props.User = append(m.Props.User, UserProperty{Key: randString(r, 4), Val: randString(r, 4)})
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
		enc := EncodeMessage(&m)
		if len(enc) != MessageSize(&m) {
			t.Fatalf("message %d: encoded %d bytes, messageSize says %d", i, len(enc), MessageSize(&m))
		}
		got, err := DecodeMessage(enc, false)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if d := sameMessage(got, m, 0); d != "" {
			t.Fatalf("message %d: %s", i, d)
		}
		d := DeadLetter{Message: m, Attempts: r.IntN(100), Reason: byte(r.Uint32()),
			FirstDelivery: m.PublishedAt, LastDelivery: m.ExpiresAt, DeadAt: time.Unix(r.Int64N(1e9), 1)}
		d.Message.Offset = r.Uint64()
		denc := AppendDeadLetter(nil, &d)
		gd, msgEnc, err := DecodeDeadLetter(denc, false)
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
			if _, err := DecodeMessage(enc[:n], false); err != nil && !errors.Is(err, ErrBadRecord) {
				t.Fatalf("message %d cut at %d: %v", i, n, err)
			}
		}
	}
}

// sameMessage reports how got differs from want (with want.Offset = off), or "".
func sameMessage(got, want Message, off uint64) string {
	want.Offset = off
	norm := func(m *Message) {
		if len(m.Payload) == 0 {
			m.Payload = nil
		}
		if len(m.Props.CorrelationData) == 0 {
			m.Props.CorrelationData = nil
		}
		if len(m.Props.User) == 0 {
			m.Props.User = nil
		}
	}
	norm(&got)
	norm(&want)
	if !got.PublishedAt.Equal(want.PublishedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
		return fmt.Sprintf("times: got %v/%v want %v/%v", got.PublishedAt, got.ExpiresAt, want.PublishedAt, want.ExpiresAt)
	}
	got.PublishedAt, got.ExpiresAt, want.PublishedAt, want.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if g, w := fmt.Sprintf("%#v", got), fmt.Sprintf("%#v", want); g != w {
		return fmt.Sprintf("\n got %s\nwant %s", g, w)
	}
	return ""
}

func FuzzDecodeMessage(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		m := randMessage(r)
		f.Add(EncodeMessage(&m))
	}
	f.Add([]byte{})
	f.Add([]byte{1, 0xff, 2, 0x80})
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeMessage(data, false)
		if _, _, derr := DecodeDeadLetter(data, false); derr != nil && !errors.Is(derr, ErrBadRecord) {
			t.Fatalf("decodeDeadLetter: unexpected error %v", derr)
		}
		if err != nil {
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		// What decodes re-encodes to something that decodes to the same message.
		again, err := DecodeMessage(EncodeMessage(&m), false)
		if err != nil {
			t.Fatalf("re-encoding of a decoded message does not decode: %v", err)
		}
		if d := sameMessage(again, m, 0); d != "" {
			t.Fatal(d)
		}
	})
}
