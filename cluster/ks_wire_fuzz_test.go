package cluster

import (
	"bytes"
	"testing"
	"time"
)

// The decoders of what other nodes send (up and down batches, a group's
// replicated state) read bytes any NATS client of the account can publish:
// they must never panic, never allocate more than the input can describe,
// and what they accept must encode back to the same bytes.

func FuzzUpBatch(f *testing.F) {
	seed := upBatch{epoch: 3, node: "node-a\x00nonce", seq: 9, items: []upItem{
		{kind: upResync}, {kind: upJoin, member: "m1", qos: 1, recvMax: 10, filters: []string{"a*", "b?"}},
		{kind: upResync, member: resyncEnd}, {kind: upActive, member: "m1", active: true},
		{kind: upAck, member: "m1", offset: 7}, {kind: upNack, member: "m1", offset: 8, reason: 0x80},
		{kind: upReject, member: "m1", offset: 9, reason: 0x99}, {kind: upOutstanding, member: "m1", offset: 10, key: "k"},
		{kind: upAcked, member: "m1", offset: 11}, {kind: upLeave, member: "m1"},
	}}
	f.Add(seed.encode())
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := decodeUpBatch(data)
		if err != nil {
			return
		}
		if len(b.items) > len(data) {
			t.Fatalf("%d items from %d bytes", len(b.items), len(data))
		}
		if out := b.encode(); !bytes.Equal(out, canonicalUp(t, data)) {
			t.Fatalf("re-encoded %x, read %x", out, data)
		}
	})
}

// canonicalUp is data as the encoder writes what data decodes to: the same
// bytes unless data used a longer varint or a non-canonical bool byte.
func canonicalUp(t *testing.T, data []byte) []byte {
	b, err := decodeUpBatch(data)
	if err != nil {
		t.Fatal(err)
	}
	again, err := decodeUpBatch(b.encode())
	if err != nil {
		t.Fatalf("an accepted batch does not decode once re-encoded: %v", err)
	}
	return again.encode()
}

func FuzzDownBatch(f *testing.F) {
	seed := downBatch{group: "0123456789ab", node: "node-b", epoch: 2, seq: 5, items: []downItem{
		{kind: downDeliver, member: "m", offset: 3, attempt: 2, msg: []byte("encoded")},
		{kind: downQoS0, member: "m", offset: 4, msg: []byte{}},
		{kind: downRevoke, member: "m", offset: 3},
	}}
	f.Add(seed.encode())
	f.Add([]byte{})
	f.Add([]byte{1, 'a', 1, 'b', 0, 0, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := decodeDownBatch(data)
		if err != nil {
			return
		}
		if len(b.items) > len(data) {
			t.Fatalf("%d items from %d bytes", len(b.items), len(data))
		}
		again, err := decodeDownBatch(b.encode())
		if err != nil {
			t.Fatalf("an accepted batch does not decode once re-encoded: %v", err)
		}
		if len(again.items) != len(b.items) || again.group != b.group || again.epoch != b.epoch || again.seq != b.seq {
			t.Fatalf("round trip changed the batch: %+v, then %+v", b, again)
		}
		for i := range b.items {
			if !bytes.Equal(b.items[i].msg, again.items[i].msg) || b.items[i].offset != again.items[i].offset {
				t.Fatalf("item %d changed: %+v, then %+v", i, b.items[i], again.items[i])
			}
		}
	})
}

func FuzzGroupState(f *testing.F) {
	st := groupState{epoch: 4, cursor: 10, dropped: 2, dlqSeq: 7, lastSeen: time.Unix(1700000000, 5), members: 3}
	st.resolved.add(12, 13)
	st.resolved.add(20, 20)
	f.Add(st.encode())
	f.Add([]byte{stateVersion})
	f.Add([]byte{stateVersion, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x03})
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := decodeGroupState(data)
		if err != nil {
			return
		}
		if len(st.resolved.r) > len(data) {
			t.Fatalf("%d ranges from %d bytes", len(st.resolved.r), len(data))
		}
		prev := st.cursor
		for _, r := range st.resolved.r {
			if r[0] <= prev || r[1] < r[0] {
				t.Fatalf("ranges not ascending above the cursor %d: %v", st.cursor, st.resolved.r)
			}
			prev = r[1]
		}
		again, err := decodeGroupState(st.encode())
		if err != nil {
			t.Fatalf("an accepted state does not decode once re-encoded: %v", err)
		}
		if again.cursor != st.cursor || again.resolved.count() != st.resolved.count() || again.epoch != st.epoch {
			t.Fatalf("round trip changed the state: %+v, then %+v", st, again)
		}
	})
}
