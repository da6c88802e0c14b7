package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/poll"
)

// groupView reads a group's detail from the admin API.
func groupView(t *testing.T, p *proc, group string) adminapi.GroupView {
	t.Helper()
	c, err := adminapi.Dial(p.addrs["http"], "")
	if err != nil {
		t.Fatal(err)
	}
	v, _, err := adminapi.Call(t.Context(), c, adminapi.GroupDetail(group))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// waitGroup polls the group's detail until ok says so.
func waitGroup(t *testing.T, p *proc, group string, what string, ok func(adminapi.GroupView) bool) adminapi.GroupView {
	t.Helper()
	var v adminapi.GroupView
	if !poll.Within(time.Minute, func() bool { v = groupView(t, p, group); return ok(v) }) {
		t.Fatalf("group %s: %s not reached: %+v", group, what, v)
	}
	return v
}

// holdingMember is a group member that acknowledges every message as it
// arrives except those of key hold (never acknowledged), and records what it
// got and what it acknowledged. It is a raw client (mqtttest.Worker): paho
// sends manual acks in arrival order, so one held message would hold back
// every later ack.
type holdingMember struct {
	*mqtttest.Worker
	hold string
	mu   sync.Mutex
	got  []string // "key:seq" in arrival order
	ack  bool     // acknowledging; false: receives but does not acknowledge
	// maxAcks, when set, stops acknowledging after that many acks.
	maxAcks int
	sent    map[string]bool
	done    chan struct{}
}

func joinHolding(t *testing.T, addr, id, filter, hold string) *holdingMember {
	t.Helper()
	w, err := mqtttest.DialWorker(addr, id, mqtttest.WorkerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m := &holdingMember{Worker: w, hold: hold, ack: true, sent: map[string]bool{}, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for msg := range w.Messages() {
			p := string(msg.Payload)
			key, _, _ := strings.Cut(p, ":")
			m.mu.Lock()
			m.got = append(m.got, p)
			if m.ack && key != m.hold && (m.maxAcks == 0 || len(m.sent) < m.maxAcks) && w.Ack(msg) == nil {
				m.sent[p] = true
			}
			m.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = w.Disconnect()
		<-m.done
	})
	if code, err := w.Subscribe(filter, 1); err != nil || code > 2 {
		t.Fatalf("subscribe %s: %v %v", filter, code, err)
	}
	return m
}

func (m *holdingMember) setAck(on bool) {
	m.mu.Lock()
	m.ack = on
	m.mu.Unlock()
}

// acked returns the messages it acknowledged.
func (m *holdingMember) acked() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]bool, len(m.sent))
	for k := range m.sent {
		out[k] = true
	}
	return out
}

// received returns what it got, in arrival order.
func (m *holdingMember) received() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.got)
}

// publishKeys publishes perKey QoS 1 messages "key:seq" (seq from first) for
// each of keys from pubs publishers in parallel; publisher i owns keys
// i, i+pubs, ..., so each key's publish order is defined.
func publishKeys(t *testing.T, addr, topic string, keys []string, first, perKey, pubs int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, pubs)
	for pi := range pubs {
		wg.Go(func() {
			pub, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: fmt.Sprintf("pub-%d-%d", first, pi), CleanStart: true, KeepAlive: 30})
			if err != nil {
				errs <- err
				return
			}
			defer pub.Close()
			for s := first; s < first+perKey; s++ {
				for k := pi; k < len(keys); k += pubs {
					pr, err := pub.Client.Publish(t.Context(), &paho.Publish{Topic: topic, QoS: 1, Payload: fmt.Appendf(nil, "%s:%d", keys[k], s),
						Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: keys[k]}}}})
					if err != nil || pr.ReasonCode != 0 {
						errs <- fmt.Errorf("publisher %d: %v (%v)", pi, err, pr)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func keyNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("key-%03d", i)
	}
	return out
}

// TestAcksAboveTheCursorSurviveSigkill: 500 keys, one of them held
// unacknowledged by its member for the whole run, everything else
// acknowledged; the held key keeps the cursor at its first message, so every
// ack above it must survive a SIGKILL on its own. After the restart the
// acknowledged messages are not delivered again (beyond what the broker
// reported not yet durable when it was killed), the held key's messages all
// come, in order.
func TestAcksAboveTheCursorSurviveSigkill(t *testing.T) {
	const perKey, group, filter = 20, "jobs/work/#", "$share/jobs/work/#"
	keys := keyNames(500)
	held := keys[0]
	dataDir := t.TempDir()
	p := startKeyline(t, dataDir) // fsync on
	addr := p.addrs["tcp"]
	a := joinHolding(t, addr, "worker-a", filter, held)
	b := joinHolding(t, addr, "worker-b", filter, held)

	// Round 1: every ack durable before the kill: none may come back.
	publishKeys(t, addr, "work/item", keys, 0, perKey, 10)
	total := len(keys) * perKey
	v := waitGroup(t, p, group, "all but the held key acked and durable", func(v adminapi.GroupView) bool {
		return v.Counters.Acked == uint64(total-perKey) && v.UnsyncedResolutions == 0
	})
	if v.Cursor >= uint64(total/2) || v.InFlight != 1 || v.StoredMessages != perKey {
		t.Fatalf("cursor %d, in flight %d, unresolved %d: the held key's first message should hold the cursor near the start, %d unresolved",
			v.Cursor, v.InFlight, v.StoredMessages, perKey)
	}
	ackedBefore := merge(a.acked(), b.acked())
	if len(ackedBefore) != total-perKey {
		t.Fatalf("members acknowledged %d, want %d", len(ackedBefore), total-perKey)
	}
	if code := p.signal(t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit %d, want killed", code)
	}

	p = startKeyline(t, dataDir)
	addr = p.addrs["tcp"]
	c := joinHolding(t, addr, "worker-c", filter, "")
	d := joinHolding(t, addr, "worker-d", filter, "")
	waitGroup(t, p, group, "the held key drained", func(v adminapi.GroupView) bool { return v.Counters.Acked == perKey && v.Backlog == 0 })
	again := 0
	var heldSeqs []int
	for _, m := range append(c.received(), d.received()...) {
		key, seq, _ := strings.Cut(m, ":")
		if key == held {
			n, _ := strconv.Atoi(seq)
			heldSeqs = append(heldSeqs, n)
			continue
		}
		if ackedBefore[m] {
			again++
		}
	}
	if !slices.Equal(heldSeqs, seqRange(0, perKey)) {
		t.Fatalf("held key after restart: %v, want 0..%d in order", heldSeqs, perKey-1)
	}
	if again != 0 {
		t.Fatalf("%d acknowledged messages delivered again, though the broker reported every ack durable", again)
	}
	t.Logf("round 1: %d acks above a cursor held at 0 survived SIGKILL; the held key's %d messages came again in order", total-perKey, perKey)

	// Round 2: kill while acks are on their way: worker-d stops after 2,000
	// acks and the broker is killed at once. What comes back is bounded by
	// what the broker reported not durable yet plus what it had not taken;
	// the count is reported.
	c.setAck(false) // worker-c receives but stops acknowledging
	d.mu.Lock()
	d.maxAcks = len(d.sent) + 2000
	d.mu.Unlock()
	publishKeys(t, addr, "work/item", keys, perKey, 10, 10)
	poll.Until(t, time.Minute, "worker-d's acks", func() bool { return len(d.acked()) >= d.maxAcks })
	roundStart := len(d.acked()) - 2000
	v = groupView(t, p, group)
	if code := p.signal(t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit %d, want killed", code)
	}
	ackedRound2 := d.acked()
	p = startKeyline(t, dataDir)
	e := joinHolding(t, p.addrs["tcp"], "worker-e", filter, "")
	waitGroup(t, p, group, "drained", func(v adminapi.GroupView) bool { return v.Backlog == 0 })
	again = 0
	for _, m := range e.received() {
		if ackedRound2[m] && !ackedBefore[m] {
			again++
		}
	}
	sent := uint64(len(ackedRound2) - roundStart)
	processed := min(v.Counters.Acked-perKey-uint64(roundStart), sent) // round 2's acks the dispatcher had taken
	bound := v.UnsyncedResolutions + sent - processed
	t.Logf("round 2: killed with %d acks sent in the round, %d taken by the dispatcher, %d resolutions not yet durable: %d acknowledged messages delivered again (bound %d)",
		sent, processed, v.UnsyncedResolutions, again, bound)
	if uint64(again) > bound {
		t.Fatalf("%d acknowledged messages delivered again, more than the %d the broker had not made durable", again, bound)
	}
}

func merge(ms ...map[string]bool) map[string]bool {
	out := map[string]bool{}
	for _, m := range ms {
		for k := range m {
			out[k] = true
		}
	}
	return out
}

func seqRange(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// killAndReadLastSegment SIGKILLs p and returns the path and the contents
// of the segment file holding the newest data.
func killAndReadLastSegment(t *testing.T, p *proc, dataDir string) (string, []byte) {
	t.Helper()
	if code := p.signal(t, syscall.SIGKILL); code != -1 {
		t.Fatalf("exit %d, want killed", code)
	}
	return lastSegment(t, dataDir)
}

// lastSegment returns the path and the contents of the segment file holding
// the newest data.
func lastSegment(t *testing.T, dataDir string) (string, []byte) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dataDir, "segments", "*.seg"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no segments in %s: %v", dataDir, err)
	}
	slices.Sort(files)
	for i := len(files) - 1; i >= 0; i-- {
		data, err := os.ReadFile(files[i])
		if err != nil {
			t.Fatal(err)
		}
		if len(data) >= 36 && binary.LittleEndian.Uint32(data[32:]) != 0 { // a first frame after the header
			return files[i], data
		}
	}
	t.Fatal("every segment is empty")
	return "", nil
}

// Segment files (format 2): a 32-byte header, then frames of a 12-byte
// header (uint32 LE body length, CRC-32C of the body, CRC-32C of those 8
// bytes) and the body.
const (
	segHeader   = 32
	frameHeader = 12
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// segFrames returns the positions of the frames of a segment file's data.
func segFrames(data []byte) []int {
	var out []int
	for pos := segHeader; pos+frameHeader <= len(data); {
		n := int(binary.LittleEndian.Uint32(data[pos:]))
		if n == 0 {
			break
		}
		out = append(out, pos)
		pos += frameHeader + n
	}
	return out
}

// frameBody returns the body of the frame at pos.
func frameBody(data []byte, pos int) []byte {
	return data[pos+frameHeader : pos+frameHeader+int(binary.LittleEndian.Uint32(data[pos:]))]
}

// resealFrame recomputes the checksums of the frame at pos after its body changed.
func resealFrame(data []byte, pos int) {
	binary.LittleEndian.PutUint32(data[pos+4:], crc32.Checksum(frameBody(data, pos), castagnoli))
	binary.LittleEndian.PutUint32(data[pos+8:], crc32.Checksum(data[pos:pos+8], castagnoli))
}

// dataEnd returns the offset where the data of a segment file ends (the
// first zero header).
func dataEnd(data []byte) int {
	fr := segFrames(data)
	if len(fr) == 0 {
		return segHeader
	}
	last := fr[len(fr)-1]
	return last + frameHeader + len(frameBody(data, last))
}

// TestTornSegmentTailIsTruncated: a record cut short at the end of the last
// segment (a commit torn by a crash) is truncated when keyline starts, and
// every message acknowledged to its publisher before it is still there.
func TestTornSegmentTailIsTruncated(t *testing.T) {
	const group, filter = "torn/t/#", "$share/torn/t/#"
	keys := keyNames(50)
	dataDir := t.TempDir()
	p := startKeyline(t, dataDir)
	addr := p.addrs["tcp"]
	m := joinHolding(t, addr, "member", filter, "")
	m.setAck(false) // creates the group; takes nothing for good
	if err := m.Disconnect(); err != nil {
		t.Fatal(err)
	}
	publishKeys(t, addr, "t/x", keys, 0, 10, 5)
	seg, data := killAndReadLastSegment(t, p, dataDir)
	end := dataEnd(data)
	// A frame header announcing 200 bytes, a wrong checksum and 37 bytes of
	// body: what a write cut by a power loss leaves.
	torn := binary.LittleEndian.AppendUint32(nil, 200)
	torn = binary.LittleEndian.AppendUint32(torn, 0xdeadbeef)
	torn = binary.LittleEndian.AppendUint32(torn, crc32.Checksum(torn, castagnoli))
	torn = append(torn, []byte("a torn record: only part of it written")[:37]...)
	f, err := os.OpenFile(seg, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(torn, int64(end)); err != nil {
		t.Fatal(err)
	}
	f.Close()

	p = startKeyline(t, dataDir)
	if !strings.Contains(p.Logs(), "torn tail") {
		t.Errorf("no log line about the torn tail:\n%s", p.Logs())
	}
	e := joinHolding(t, p.addrs["tcp"], "member-2", filter, "")
	waitGroup(t, p, group, "drained", func(v adminapi.GroupView) bool { return v.Backlog == 0 && v.Counters.Acked == 500 })
	got := map[string][]int{}
	for _, msg := range e.received() {
		key, seq, _ := strings.Cut(msg, ":")
		n, _ := strconv.Atoi(seq)
		got[key] = append(got[key], n)
	}
	for _, k := range keys {
		if !slices.Equal(got[k], seqRange(0, 10)) {
			t.Fatalf("key %s after the torn tail: %v, want 0..9", k, got[k])
		}
	}
	// And the log goes on from where it was.
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, p.addrs["tcp"], nil), &paho.Connect{ClientID: "after", CleanStart: true, KeepAlive: 30})
	pub.Publish(t, &paho.Publish{Topic: "t/x", QoS: 1, Payload: []byte("key-000:10")})
	waitGroup(t, p, group, "one more", func(v adminapi.GroupView) bool { return v.Head == 501 && v.Counters.Acked == 501 })
	pub.Close()
}

var _ = context.Background

// dirSize returns the bytes the files under dir hold.
func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // renamed or removed between the directory read and the stat (a segment's .tmp)
		}
		if err == nil {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestBlockedKeyKeepsTheDataDirSmall: messages flow through one group while
// one key's first message is never acknowledged, so the cursor never moves;
// the data dir must follow the unresolved messages (that key's), not the
// oldest one. 100,000 messages by default; KEYLINE_LONG=1 runs 1,000,000.
func TestBlockedKeyKeepsTheDataDirSmall(t *testing.T) {
	const group, filter, segment = "disk/d/#", "$share/disk/d/#", 1 << 20
	keys := keyNames(1000)
	perKey := 100
	if os.Getenv("KEYLINE_LONG") != "" {
		perKey = 1000
	}
	dataDir := t.TempDir()
	// The held message must stay held for the whole run (1,000,000 messages
	// take minutes): past the default 30 s ack timeout it would be retried
	// and, after five attempts, dead-lettered (resolved).
	p := startKeyline(t, dataDir, "--fsync=false", "--ack-timeout", "1h")
	addr := p.addrs["tcp"]
	joinHolding(t, addr, "worker-a", filter, keys[0])
	joinHolding(t, addr, "worker-b", filter, keys[0])
	var maxDir int64
	var worst adminapi.GroupView
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() { // sample the data dir while messages flow
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if n := dirSize(t, dataDir); n > maxDir {
					maxDir = n
				}
			}
		}
	}()
	start := time.Now()
	for round := 0; round < perKey; round += 10 {
		publishKeys(t, addr, "d/x", keys, round, 10, 10)
	}
	total := len(keys) * perKey
	worst = waitGroup(t, p, group, "all but the held key acked", func(v adminapi.GroupView) bool {
		return v.Counters.Acked == uint64(total-perKey)
	})
	close(stop)
	<-sampled
	end := dirSize(t, dataDir)
	t.Logf("%d messages in %v; held key: %d messages, %d bytes unresolved; data dir at most %d bytes during the run, %d at the end (%d-byte segments)",
		total, time.Since(start).Round(time.Millisecond), worst.StoredMessages, worst.StoredBytes, maxDir, end, segment)
	if worst.StoredMessages != uint64(perKey) {
		t.Fatalf("%d unresolved, want the held key's %d", worst.StoredMessages, perKey)
	}
	// Bound: the active and the spare segment, one being compacted, the data
	// file, and a small multiple of what is unresolved.
	if limit := int64(4*segment) + 8*int64(worst.StoredBytes) + 1<<20; maxDir > limit {
		t.Fatalf("data dir reached %d bytes for %d unresolved bytes (limit %d): disk follows the oldest message, not the unresolved ones", maxDir, worst.StoredBytes, limit)
	}
}

// TestUndecodableRecordIsQuarantined: a log record whose frame is intact
// but whose message cannot be decoded is set aside (kept raw, counted,
// shown in the admin API) and the group goes on with the rest.
func TestUndecodableRecordIsQuarantined(t *testing.T) {
	const group, filter = "bad/b/#", "$share/bad/b/#"
	dataDir := t.TempDir()
	p := startKeyline(t, dataDir)
	addr := p.addrs["tcp"]
	m := joinHolding(t, addr, "member", filter, "")
	m.setAck(false)
	if err := m.Disconnect(); err != nil {
		t.Fatal(err)
	}
	keys := keyNames(30)
	publishKeys(t, addr, "b/x", keys, 0, 10, 3)
	// Spoil offset 150's message (its codec version byte) and seal the frame
	// again with a valid checksum: only the decoder can tell.
	seg, data := killAndReadLastSegment(t, p, dataDir)
	spoiled := false
	for _, pos := range segFrames(data) {
		body := frameBody(data, pos)
		if body[0] != 4 { // a message record: type, uvarint count, (uvarint group, uvarint offset)..., message
			continue
		}
		count, c := binary.Uvarint(body[1:])
		at, off := 1+c, uint64(0)
		for range count {
			_, g := binary.Uvarint(body[at:])
			o, n := binary.Uvarint(body[at+g:])
			at, off = at+g+n, o
		}
		if count == 1 && off == 150 {
			body[at] = 99
			resealFrame(data, pos)
			spoiled = true
			break
		}
	}
	if !spoiled {
		t.Fatal("offset 150 not found in the last segment")
	}
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p = startKeyline(t, dataDir)
	w := joinHolding(t, p.addrs["tcp"], "member-2", filter, "")
	v := waitGroup(t, p, group, "the good messages delivered", func(v adminapi.GroupView) bool { return v.Backlog == 0 })
	if got := len(w.received()); got != 299 || v.Quarantined != 1 || v.Counters.Acked != 299 {
		t.Fatalf("delivered %d, quarantined %d, acked %d: want 299, 1, 299", got, v.Quarantined, v.Counters.Acked)
	}
	if !strings.Contains(p.Logs(), "quarantined a group log record") {
		t.Errorf("no log line about the quarantined record")
	}
}
