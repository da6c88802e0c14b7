package outbox

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/keyline-mq/keyline/internal/frame"
)

// bigPublish is a QoS 1 PUBLISH whose payload is n in size digits.
func bigPublish(t *testing.T, n, size int) *frame.Publish {
	payload := fmt.Appendf(nil, "%0*d", size, n)
	rl := 3 + 2 + len(payload)
	b := []byte{0x32}
	for {
		d := byte(rl % 128)
		rl /= 128
		if rl > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if rl == 0 {
			break
		}
	}
	b = append(b, 0, 1, 't', 0, 1)
	p, err := frame.Parse(append(b, payload...), 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSpillKeepsAStalledSessionsBacklogOutOfMemory: a session whose client
// does not read holds only the Spill's threshold of frames in memory; the
// rest is written to its spill file and read back, in order, when the
// client drains; the file holds nothing once it is drained and is gone with
// its outbox.
func TestSpillKeepsAStalledSessionsBacklogOutOfMemory(t *testing.T) {
	dir := t.TempDir()
	left := dir + "/old.spill"
	if err := os.WriteFile(left, []byte("a previous process's"), 0o600); err != nil {
		t.Fatal(err)
	}
	sp, err := NewSpill(dir, 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("NewSpill left a previous file: %v", err)
	}
	cfg := &Config{Max: 10000, Spill: sp}
	o := New("c", cfg)
	conn := &fakeConn{}
	o.Attach(conn, 0)
	const n, size = 1000, 1024
	for i := range n {
		if i == 5 {
			conn.full = true // the client stops reading
		}
		if !o.Add(bigPublish(t, i, size), 1, 0, 0) {
			t.Fatalf("message %d refused", i)
		}
		o.mu.Lock()
		mem := o.mu.mem
		o.mu.Unlock()
		if mem > 16<<10+2*size {
			t.Fatalf("after %d messages %d bytes of frames in memory, spill threshold %d", i+1, mem, 16<<10)
		}
	}
	if got := sp.Spilled.Load(); got < n-30 {
		t.Fatalf("%d of %d messages spilled", got, n)
	}
	if held, _ := o.Len(); held != n {
		t.Fatalf("held %d of %d", held, n)
	}
	if info := o.Snapshot(n); !info[n-1].Cold || info[n-1].Size != len(bigPublish(t, n-1, size).B) {
		t.Fatalf("a spilled message's info: %+v", info[n-1])
	}
	// The client reads again, acknowledging as it goes.
	conn.full = false
	for len(conn.sends) < n {
		before := len(conn.sends)
		if w := conn.wake; w != nil {
			conn.wake = nil
			w()
		}
		for _, s := range conn.sends[before:] {
			o.Ack(4, s.id, 0)
		}
		if len(conn.sends) == before {
			o.Pump()
			if len(conn.sends) == before {
				t.Fatalf("stuck after %d of %d sends", before, n)
			}
		}
	}
	for i, s := range conn.sends {
		if s.n != i {
			t.Fatalf("send %d is message %d: out of order", i, s.n)
		}
	}
	if b, l := sp.Bytes.Load(), sp.Loaded.Load(); b != 0 || l != sp.Spilled.Load() {
		t.Fatalf("after draining the spill holds %d bytes; %d of %d spilled messages read back", b, l, sp.Spilled.Load())
	}
	o.mu.Lock()
	sf := o.spillFile()
	o.mu.Unlock()
	if st, err := sf.f.Stat(); err != nil || st.Size() != 0 {
		t.Fatalf("the drained spill file: %v, size %d", err, st.Size())
	}
	o.Discard()
	if sp.files.Load() != 0 {
		t.Fatalf("%d spill files open after Discard", sp.files.Load())
	}
}

// TestSpillFilesAreBounded: past the most files open at once an outbox
// keeps its frames in memory, as without a Spill.
func TestSpillFilesAreBounded(t *testing.T) {
	sp, err := NewSpill(t.TempDir(), 100)
	if err != nil {
		t.Fatal(err)
	}
	sp.maxFiles = 2
	cfg := &Config{Max: 100, Spill: sp}
	var boxes []*Outbox
	for c := range 3 {
		o := New(strconv.Itoa(c), cfg)
		boxes = append(boxes, o)
		for i := range 10 {
			o.Add(bigPublish(t, i, 64), 1, 0, 0) // no connection: nothing is sent
		}
	}
	if n := sp.files.Load(); n != 2 {
		t.Fatalf("%d spill files open, at most 2", n)
	}
	boxes[2].mu.Lock()
	mem := boxes[2].mu.mem
	boxes[2].mu.Unlock()
	if mem < 10*64 {
		t.Fatalf("the third outbox holds %d bytes in memory: it should keep all 10 messages there", mem)
	}
	for _, o := range boxes {
		o.Discard()
	}
	if n := sp.files.Load(); n != 0 {
		t.Fatalf("%d spill files open after Discard", n)
	}
	if _, err := NewSpill(t.TempDir(), 0); err == nil {
		t.Fatal("a spill threshold of 0 was accepted")
	}
}

// TestSpillLetsPersistentFramesGoCold: a persistent session's frames are in
// its Store already, so past the threshold the outbox lets them go once
// their records are committed (no second copy in a spill file) and reads
// them back from the Store, in order, when the client drains; frames whose
// records are still being written wait in memory meanwhile.
func TestSpillLetsPersistentFramesGoCold(t *testing.T) {
	sp, err := NewSpill(t.TempDir(), 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	store := &durableStore{memStore: &memStore{recs: map[uint64][]byte{}}}
	cfg := &Config{Max: 10000, Spill: sp, Store: store}
	o := New("c", cfg)
	o.SetPersistent(true)
	conn := &fakeConn{}
	o.Attach(conn, 20)
	const n, size, commitEvery = 1000, 1024, 8
	acked := 0
	for i := range n {
		if i == 5 {
			conn.full = true // the client stops reading
		}
		added, pending := o.AddDurable(bigPublish(t, i, size), 1, 0, 0, func(err error) {
			if err == nil {
				acked++
			}
		})
		if !added || !pending {
			t.Fatalf("message %d: added %v, pending %v", i, added, pending)
		}
		if i%commitEvery == commitEvery-1 {
			store.commit()
		}
		o.mu.Lock()
		mem := o.mu.mem
		o.mu.Unlock()
		if mem > 16<<10+(commitEvery+2)*size {
			t.Fatalf("after %d messages %d bytes of frames in memory, threshold %d", i+1, mem, 16<<10)
		}
	}
	store.commit()
	if acked != n {
		t.Fatalf("%d of %d publishers told their message is stored", acked, n)
	}
	if sp.Spilled.Load() != 0 || sp.files.Load() != 0 {
		t.Fatalf("%d messages in a spill file (%d open): the Store holds them", sp.Spilled.Load(), sp.files.Load())
	}
	if c := sp.Cooled.Load(); c < n-40 || cfg.Stats.ColdBytes.Load() == 0 {
		t.Fatalf("%d of %d messages went cold, %d cold bytes", c, n, cfg.Stats.ColdBytes.Load())
	}
	conn.full = false
	for answered := 0; len(conn.sends) < n; {
		before := len(conn.sends)
		if w := conn.wake; w != nil {
			conn.wake = nil
			w()
		}
		for ; answered < len(conn.sends); answered++ {
			o.Ack(4, conn.sends[answered].id, 0)
		}
		if len(conn.sends) == before {
			o.Pump()
			if len(conn.sends) == before {
				t.Fatalf("stuck after %d of %d sends", before, n)
			}
		}
	}
	for i, s := range conn.sends {
		if s.n != i || s.dup {
			t.Fatalf("send %d is message %d (dup %v): want message %d, first send", i, s.n, s.dup, i)
		}
	}
	if held, _ := o.Len(); held != 0 || len(store.recs) != 0 || cfg.Stats.ColdBytes.Load() != 0 || cfg.Stats.LoadErrors.Load() != 0 {
		t.Fatalf("after draining: %d held, %d records, %d cold bytes, %d load errors", held, len(store.recs), cfg.Stats.ColdBytes.Load(), cfg.Stats.LoadErrors.Load())
	}
}

// spillFile is the outbox's spill file, nil if none (under o.mu).
func (o *Outbox) spillFile() *spillFile {
	if o.mu.off == nil {
		return nil
	}
	return o.mu.off.spill
}
