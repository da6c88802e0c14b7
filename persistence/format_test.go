package persistence

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/keyline-mq/keyline/persistence/seglog"
)

// extractV1 unpacks testdata/v1.tar.gz, a data dir written by the keyline
// of data format 1 (see testdata/genv1), into a new directory.
func extractV1(t testing.TB) string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "v1.tar.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return dir
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir) {
			t.Fatalf("bad path %q", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o700)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, 0o600)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// v1Order is the payload genv1 published as message i.
func v1Order(i int) string {
	p := fmt.Sprintf("order %d ", i)
	return p + strings.Repeat(".", 150-len(p))
}

// TestOpensDataFormat1: a data dir written by the keyline before data
// formats had a number opens as it is: every group, message, dead letter
// and session record is there, keyline.db records format 2, and new
// records go to a segment of the current format.
func TestOpensDataFormat1(t *testing.T) {
	dir := extractV1(t)
	oldSegs, err := filepath.Glob(filepath.Join(dir, SegmentsDir, "*.seg"))
	if err != nil || len(oldSegs) < 3 {
		t.Fatalf("testdata segments %v, %v", oldSegs, err)
	}
	before := dirContents(t, filepath.Join(dir, SegmentsDir))
	db := openTestDB(t, dir, Options{SegmentSize: 64 << 10})
	s := db.Groups()
	if rep := db.groups.log.Recovery(); rep.Corrupt != 0 || rep.TornBytes != 0 || rep.Lost != 0 {
		t.Fatalf("recovery %+v", rep)
	}
	for _, want := range []struct {
		name         string
		stored, dead uint64
	}{{"audit/orders/#", 400, 0}, {"workers/orders/#", 249, 1}} {
		gi := mustInfo(t, s, want.name)
		if gi.Head != 400 || gi.StoredMessages != want.stored || gi.DeadLetters != want.dead {
			t.Fatalf("%s: %+v", want.name, gi)
		}
	}
	l, err := s.Log("audit/orders/#")
	if err != nil {
		t.Fatal(err)
	}
	all := readAll(t, l, 1)
	if len(all) != 400 {
		t.Fatalf("audit holds %d", len(all))
	}
	for i, m := range all {
		n := i + 1
		if m.Offset != uint64(n) || string(m.Payload) != v1Order(n) || m.Topic != fmt.Sprintf("orders/%d", n%10) || m.Key != fmt.Sprintf("k%d", n%13) || m.QoS != 1 {
			t.Fatalf("audit %d: %+v", n, m)
		}
	}
	l, _ = s.Log("workers/orders/#")
	if got := readAll(t, l, 1); len(got) != 249 {
		t.Fatalf("workers holds %d", len(got))
	}
	dl, err := s.DeadLetters("workers/orders/#", 0, 10)
	if err != nil || len(dl) != 1 || dl[0].Reason != 0x99 || !strings.HasPrefix(string(dl[0].Message.Payload), "order ") {
		t.Fatalf("dead letters %+v, %v", dl, err)
	}
	ss, err := db.OpenSessions()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, kind := range []string{KindRecords, KindRetained, KindOutbox} {
		if err := ss.ForEach(kind, func(k, v []byte) error {
			counts[kind]++
			if kind == KindRetained && (string(k) != "config/site" || !bytes.Contains(v, []byte(`"config/site"`))) {
				return fmt.Errorf("retained %q = %s", k, v)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// offline-1's session record (client and subscription, converted to
	// format 3) and outbox (5 messages and its outbox record).
	if counts[KindRecords] != 1 || counts[KindRetained] != 1 || counts[KindOutbox] != 6 {
		t.Fatalf("session records %v", counts)
	}
	checkV1Session(t, ss.Records())
	if off := mustAppend(t, s, "audit/orders/#", msg("orders/new", "after the upgrade")); off != 401 {
		t.Fatalf("offset %d", off)
	}
	err = db.bolt.View(func(tx *bolt.Tx) error {
		v, err := formatOf(tx)
		if err == nil && v != FormatVersion {
			err = fmt.Errorf("format %d", v)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// The old segments were not written; the new message went to a new one.
	after := dirContents(t, filepath.Join(dir, SegmentsDir))
	for _, p := range oldSegs[:len(oldSegs)-1] { // the last one was the spare
		name := strings.TrimPrefix(p, filepath.Join(dir, SegmentsDir))
		if after[name] != before[name] {
			t.Fatalf("%s was written", name)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = openTestDB(t, dir, Options{SegmentSize: 64 << 10})
	if gi := mustInfo(t, db.Groups(), "audit/orders/#"); gi.Head != 401 || gi.StoredMessages != 401 {
		t.Fatalf("after reopen: %+v", gi)
	}
}

// TestRefusesNewerData: keyline.db or a segment of a newer format stops
// Open with one line naming the file and both formats, and nothing changes.
func TestRefusesNewerData(t *testing.T) {
	build := func(t *testing.T) string {
		dir := t.TempDir()
		db := openTestDB(t, dir, Options{NoSync: true})
		ensure(t, db.Groups(), "g/#", GroupConfig{})
		mustAppend(t, db.Groups(), "g/#", fullMsg(1))
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	t.Run("keyline.db", func(t *testing.T) {
		dir := build(t)
		path := filepath.Join(dir, FileName)
		b, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Update(func(tx *bolt.Tx) error { return putFormat(tx, FormatVersion+1) }); err != nil {
			t.Fatal(err)
		}
		b.Close()
		before := dirContents(t, dir)
		_, err = Open(dir, Options{Logger: testLogger(t)})
		want := fmt.Sprintf("%s is data format %d; this keyline reads formats 1 to %d", path, FormatVersion+1, FormatVersion)
		if !errors.Is(err, ErrNewerFormat) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("Open = %v, want %q", err, want)
		}
		t.Logf("Open: %v", err)
		if after := dirContents(t, dir); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatal("Open changed the data dir")
		}
	})
	t.Run("segment", func(t *testing.T) {
		dir := build(t)
		segs, _ := filepath.Glob(filepath.Join(dir, SegmentsDir, "*.seg"))
		b, err := os.ReadFile(segs[0])
		if err != nil {
			t.Fatal(err)
		}
		// A header that checks, of the next format (seglog's layout: magic,
		// format, id, size, CRC-32C of those).
		h := binary.LittleEndian.AppendUint32([]byte("KLSG"), seglog.FormatVersion+1)
		h = binary.LittleEndian.AppendUint64(h, 1)
		h = binary.LittleEndian.AppendUint64(h, uint64(len(b)))
		h = binary.LittleEndian.AppendUint32(h, crc32.Checksum(h, crc32.MakeTable(crc32.Castagnoli)))
		copy(b, h)
		if err := os.WriteFile(segs[0], b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = Open(dir, Options{Logger: testLogger(t)})
		if !errors.Is(err, seglog.ErrNewerFormat) || !strings.Contains(err.Error(), segs[0]) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("Open = %v", err)
		}
		t.Logf("Open: %v", err)
	})
}
