package connq

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
)

// bang refuses a stream at its first '!' and answers "bye".
type bang struct{ seen int }

var errBang = errors.New("a bang")

func (i *bang) Inspect(b []byte) (int, []byte, error) {
	if k := bytes.IndexByte(b, '!'); k >= 0 {
		return k, []byte("bye"), errBang
	}
	i.seen += len(b)
	return len(b), nil, nil
}

// TestInspectorEndsTheConnection: the reader gets every byte before the
// offending one and answers them; then Read fails, and the client receives
// those answers, the Inspector's reply and the end of the connection.
func TestInspectorEndsTheConnection(t *testing.T) {
	for name, sent := range map[string]string{"after good bytes": "abc!def", "at once": "!def"} {
		t.Run(name, func(t *testing.T) {
			a, peer := tcpPair(t)
			stats := new(Stats)
			c := New(a, Limits{Soft: 1 << 10, Hard: 1 << 20}, stats, nil)
			c.Inspect(&bang{})
			if _, err := peer.Write([]byte(sent)); err != nil {
				t.Fatal(err)
			}
			want, _, _ := bytes.Cut([]byte(sent), []byte("!"))
			var passed []byte
			buf := make([]byte, 64)
			var err error
			for err == nil {
				var n int
				n, err = c.Read(buf)
				passed = append(passed, buf[:n]...)
				if n > 0 && bytes.Equal(passed, want) {
					_, _ = c.Write([]byte("ack")) // the reader answers what it got
				}
			}
			if !errors.Is(err, errBang) || !bytes.Equal(passed, want) {
				t.Fatalf("read %q, then %v; want %q, then %v", passed, err, want, errBang)
			}
			if _, again := c.Read(buf); !errors.Is(again, errBang) {
				t.Fatalf("a second Read after the refusal: %v", again)
			}
			_ = peer.SetReadDeadline(time.Now().Add(10 * time.Second))
			got, rerr := io.ReadAll(peer)
			wantOut := "bye"
			if len(want) > 0 {
				wantOut = "ackbye"
			}
			if rerr != nil || string(got) != wantOut {
				t.Fatalf("the client received %q (%v), want %q and the end of the connection", got, rerr, wantOut)
			}
			<-c.Done()
			if n := stats.ProtocolErrors.Load(); n != 1 {
				t.Fatalf("ProtocolErrors = %d", n)
			}
		})
	}
}
