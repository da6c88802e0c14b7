package persistence

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/persistence/seglog"
)

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
