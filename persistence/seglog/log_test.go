package seglog

import (
	"bytes"
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	l := openLog(t, smallOpts(t, dir), nil)
	if err := l.AddGroup(1, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddGroup(2, GroupState{}, Limits{}); err != nil {
		t.Fatal(err)
	}
	for n := uint64(1); n <= 100; n++ {
		res := appendWait(t, l, []uint64{1, 2}, payload(1, n, 40))
		for i, r := range res {
			if r.Err != nil || r.Offset != n {
				t.Fatalf("append %d to group %d: %+v", n, i+1, r)
			}
		}
	}
	for _, g := range []uint64{1, 2} {
		got := readAll(t, l, g, 1)
		if len(got) != 100 {
			t.Fatalf("group %d: read %d entries", g, len(got))
		}
		for i, e := range got {
			if e.Offset != uint64(i+1) || !bytes.Equal(e.Data, payload(1, uint64(i+1), 40)) {
				t.Fatalf("group %d: entry %d: %d %q", g, i, e.Offset, e.Data)
			}
		}
	}
	if err := l.checkInvariants(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2 := openLog(t, smallOpts(t, dir), map[uint64]GroupState{1: {}, 2: {}})
	for _, g := range []uint64{1, 2} {
		got := readAll(t, l2, g, 0)
		if len(got) != 100 {
			t.Fatalf("after reopen: group %d: read %d entries", g, len(got))
		}
		for i, e := range got {
			if e.Offset != uint64(i+1) || !bytes.Equal(e.Data, payload(1, uint64(i+1), 40)) {
				t.Fatalf("after reopen: group %d: entry %d: %d %q", g, i, e.Offset, e.Data)
			}
		}
	}
	if off := appendOK(t, l2, 1, []byte("next")); off != 101 {
		t.Fatalf("offset after reopen: %d", off)
	}
	res := appendWait(t, l2, []uint64{3}, []byte("x"))
	if !errors.Is(res[0].Err, ErrGroupNotFound) {
		t.Fatalf("append to an unknown group: %v", res[0].Err)
	}
}
