package mqttwire

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestVarint(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want []byte
	}{
		{0, []byte{0x00}},
		{127, []byte{0x7f}},
		{128, []byte{0x80, 0x01}},
		{16383, []byte{0xff, 0x7f}},
		{16384, []byte{0x80, 0x80, 0x01}},
		{2097151, []byte{0xff, 0xff, 0x7f}},
		{2097152, []byte{0x80, 0x80, 0x80, 0x01}},
		{MaxRemaining, []byte{0xff, 0xff, 0xff, 0x7f}},
	} {
		b := AppendVarint([]byte{0xaa}, tc.n)
		if !bytes.Equal(b[1:], tc.want) {
			t.Errorf("AppendVarint(%d) = % x, want % x", tc.n, b[1:], tc.want)
		}
		if VarintLen(tc.n) != len(tc.want) {
			t.Errorf("VarintLen(%d) = %d, want %d", tc.n, VarintLen(tc.n), len(tc.want))
		}
		n, size, err := ReadVarint(append(tc.want, 0x55))
		if n != tc.n || size != len(tc.want) || err != nil {
			t.Errorf("ReadVarint(% x) = %d, %d, %v", tc.want, n, size, err)
		}
	}
	for _, tc := range []struct {
		in   []byte
		want error
	}{
		{nil, ErrIncomplete},
		{[]byte{0x80}, ErrIncomplete},
		{[]byte{0xff, 0xff, 0xff}, ErrIncomplete},
		{[]byte{0x80, 0x80, 0x80, 0x80}, ErrMalformed},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0x01}, ErrMalformed},
	} {
		if _, _, err := ReadVarint(tc.in); !errors.Is(err, tc.want) {
			t.Errorf("ReadVarint(% x): %v, want %v", tc.in, err, tc.want)
		}
	}
}

func TestAppendPanicsOnWhatMQTTCannotCarry(t *testing.T) {
	for name, f := range map[string]func(){
		"negative varint": func() { AppendVarint(nil, -1) },
		"varint":          func() { AppendVarint(nil, MaxRemaining+1) },
		"string":          func() { AppendString(nil, string(make([]byte, MaxString+1))) },
		"binary":          func() { AppendBinary(nil, make([]byte, MaxString+1)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
	if b := AppendString(nil, string(make([]byte, MaxString))); len(b) != 2+MaxString || b[0] != 0xff || b[1] != 0xff {
		t.Errorf("string of MaxString bytes: %d bytes, length % x", len(b), b[:2])
	}
}

func TestParseHeader(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want Header
		err  error
	}{
		{[]byte{0x30, 0x00}, Header{Type: TypePublish, Remaining: 0, Size: 2}, nil},
		{[]byte{0x3d, 0x80, 0x01, 0xee}, Header{Type: TypePublish, Flags: 0x0d, Remaining: 128, Size: 3}, nil},
		{[]byte{0x62, 0xff, 0xff, 0xff, 0x7f}, Header{Type: TypePubrel, Flags: 2, Remaining: MaxRemaining, Size: 5}, nil},
		{nil, Header{}, ErrIncomplete},
		{[]byte{0x30}, Header{}, ErrIncomplete},
		{[]byte{0x30, 0x80, 0x80}, Header{}, ErrIncomplete},
		{[]byte{0x30, 0x80, 0x80, 0x80, 0x80}, Header{}, ErrMalformed},
	} {
		h, err := ParseHeader(tc.in)
		if h != tc.want || !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
			t.Errorf("ParseHeader(% x) = %+v, %v; want %+v, %v", tc.in, h, err, tc.want, tc.err)
		}
	}
	b := AppendHeader(nil, TypeSubscribe, 0x02, 321)
	if h, err := ParseHeader(b); err != nil || h != (Header{Type: TypeSubscribe, Flags: 2, Remaining: 321, Size: 3}) {
		t.Errorf("AppendHeader/ParseHeader: % x -> %+v, %v", b, h, err)
	}
}

// stream is three frames: a small PUBLISH, one larger than a 64-byte
// buffer, and a PINGRESP.
func stream() (frames [][]byte, all []byte) {
	frames = [][]byte{
		AppendPublish(nil, Version5, &Publish{Topic: "a/b", Payload: []byte("hi")}),
		AppendPublish(nil, Version5, &Publish{Topic: "big", QoS: 1, PacketID: 9, Payload: bytes.Repeat([]byte("x"), 300)}),
		{TypePingresp << 4, 0},
	}
	return frames, bytes.Join(frames, nil)
}

func TestReader(t *testing.T) {
	frames, all := stream()
	for name, src := range map[string]io.Reader{
		"whole":       bytes.NewReader(all),
		"one byte":    iotest.OneByteReader(bytes.NewReader(all)),
		"half chunks": iotest.HalfReader(bytes.NewReader(all)),
	} {
		r := NewReader(src, 64)
		for i, f := range frames {
			p, err := r.Next()
			if err != nil {
				t.Fatalf("%s: frame %d: %v", name, i, err)
			}
			h, _ := ParseHeader(f)
			if p.Type != h.Type || p.Flags != h.Flags || !bytes.Equal(p.Body, f[h.Size:]) {
				t.Fatalf("%s: frame %d: got %+v, want % x", name, i, p, f)
			}
		}
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("%s: after the last frame: %v, want io.EOF", name, err)
		}
	}
}

func TestReaderBuffered(t *testing.T) {
	_, all := stream()
	r := NewReader(bytes.NewReader(all), 4096)
	if r.Buffered() {
		t.Fatal("Buffered before any read")
	}
	for i := range 3 {
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
		if want := i < 2; r.Buffered() != want {
			t.Fatalf("after frame %d: Buffered %v, want %v", i, r.Buffered(), want)
		}
	}
}

func TestReaderErrors(t *testing.T) {
	_, all := stream()
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, io.EOF},
		{"first byte only", all[:1], io.ErrUnexpectedEOF},
		{"inside the length", []byte{0x30, 0x80}, io.ErrUnexpectedEOF},
		{"inside the body", all[:5], io.ErrUnexpectedEOF},
		{"inside a large body", all[:len(all)-50], io.ErrUnexpectedEOF},
		{"length over four bytes", []byte{0x30, 0xff, 0xff, 0xff, 0xff, 0x01}, ErrMalformed},
		{"256 MiB announced, 3 bytes sent", []byte{0x30, 0xff, 0xff, 0xff, 0x7f, 1, 2, 3}, io.ErrUnexpectedEOF},
	} {
		r := NewReader(bytes.NewReader(tc.in), 64)
		var err error
		for err == nil {
			_, err = r.Next()
		}
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func TestReaderLimit(t *testing.T) {
	small := AppendPublish(nil, Version311, &Publish{Topic: "t", Payload: make([]byte, 10)})
	big := AppendPublish(nil, Version311, &Publish{Topic: "t", Payload: make([]byte, 100)})
	r := NewReader(bytes.NewReader(append(small, big...)), 64)
	r.Limit = 50
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "PUBLISH of 103 bytes, at most 50") {
		t.Fatalf("a frame past the limit: %v, want ErrTooLarge naming its size", err)
	}
}

// BenchmarkReadPublish reads and decodes a stream of 64-byte QoS 0
// publishes carrying a key property, as a load generator's subscriber does.
func BenchmarkReadPublish(b *testing.B) {
	frame := AppendPublish(nil, Version5, &Publish{Topic: "bench/shared",
		Props: Properties{User: []UserProperty{{"key", "k12"}}}, Payload: make([]byte, 64)})
	in := bytes.Repeat(frame, 1000)
	src := bytes.NewReader(in)
	r := NewReader(src, 64<<10)
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		p, err := r.Next()
		if err == io.EOF {
			src.Reset(in)
			p, err = r.Next()
		}
		if err != nil {
			b.Fatal(err)
		}
		m, err := DecodePublish(Version5, p)
		if _, ok := m.Props.UserValue("key"); err != nil || !ok {
			b.Fatal("no key")
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
