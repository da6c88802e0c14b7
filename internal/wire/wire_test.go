package wire

import (
	"errors"
	"testing"
	"time"
)

var errTest = errors.New("test record")

func TestRoundTripAndErrors(t *testing.T) {
	var b []byte
	b = append(b, 7)
	b = AppendString(b, "topic")
	b = AppendBytes(b, nil)
	b = append(b, 0x02) // a count of 2
	b = AppendString(b, "a")
	b = AppendString(b, "b")
	d := NewDecoder(b, errTest)
	if d.Byte() != 7 || d.String() != "topic" || d.Bytes() != nil {
		t.Fatal("fields read back wrong")
	}
	n := d.Count()
	if n != 2 || d.StringView() != "a" || d.String() != "b" || d.Done() != nil {
		t.Fatalf("count %d, err %v", n, d.Err())
	}
	if len(b) != 1+StringLen(5)+1+1+2*StringLen(1) {
		t.Fatalf("StringLen disagrees with AppendString: %d bytes", len(b))
	}
	// A count larger than what is left fails before anyone allocates it.
	d = NewDecoder([]byte{0xff, 0xff, 0x03}, errTest)
	if d.Count() != 0 || !errors.Is(d.Err(), errTest) {
		t.Fatalf("oversized count: %v", d.Err())
	}
	// The first error sticks; later reads return zero values.
	d = NewDecoder([]byte{5, 'a'}, errTest)
	if d.String() != "" || d.Byte() != 0 || !errors.Is(d.Err(), errTest) {
		t.Fatalf("truncated string: %v", d.Err())
	}
	d = NewDecoder([]byte{1, 2}, errTest)
	d.Byte()
	if err := d.Done(); !errors.Is(err, errTest) {
		t.Fatalf("trailing bytes: %v", err)
	}
	for _, tm := range []time.Time{{}, time.Unix(0, 1), time.Unix(1_700_000_000, 5)} {
		if got := TimeFromNanos(TimeNanos(tm)); !got.Equal(tm) {
			t.Fatalf("time %v read back as %v", tm, got)
		}
	}
	if VarintLen(-1) != 1 || UvarintLen(1<<14) != 3 {
		t.Fatal("varint lengths")
	}
}
