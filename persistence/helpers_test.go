package persistence

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyline-mq/keyline/keyshared"
	bolt "go.etcd.io/bbolt"
)

// testLogger routes the store's logs to t.Log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// openTestDB opens a DB in dir and, in t.Cleanup, closes it and runs bbolt's
// consistency check on the file.
func openTestDB(t testing.TB, dir string, opts Options) *DB {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	db, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if err := checkFile(filepath.Join(dir, FileName)); err != nil {
			t.Errorf("consistency check: %v", err)
		}
	})
	return db
}

// checkFile runs bbolt's consistency check on a closed database file.
func checkFile(path string) error {
	b, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer b.Close()
	var errs []error
	err = b.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			errs = append(errs, err)
		}
		return nil
	})
	return errors.Join(append(errs, err)...)
}

// msg builds a test message.
func msg(topic, payload string) keyshared.Message {
	return keyshared.Message{
		Key:         topic,
		Topic:       topic,
		Payload:     []byte(payload),
		QoS:         1,
		PublishedAt: time.Unix(1_700_000_000, 123456789),
	}
}

// fullMsg builds a message that uses every field.
func fullMsg(i int) keyshared.Message {
	return keyshared.Message{
		Key:     fmt.Sprintf("device-%d", i%7),
		Topic:   fmt.Sprintf("orders/%d/created", i),
		Payload: []byte(fmt.Sprintf("payload %d", i)),
		QoS:     byte(1 + i%2),
		Props: keyshared.Properties{
			PayloadFormat:    1,
			PayloadFormatSet: true,
			ContentType:      "application/json",
			ResponseTopic:    "replies/" + fmt.Sprint(i),
			CorrelationData:  []byte{0, 1, byte(i)},
			User:             []keyshared.UserProperty{{Key: "key", Val: "k"}, {Key: "key", Val: "dup"}, {Key: "ü", Val: ""}},
		},
		PublishedAt: time.Unix(1_700_000_000+int64(i), 42),
		ExpiresAt:   time.Unix(1_800_000_000, 0),
	}
}

// sameMessage reports how got differs from want (with want.Offset = off), or "".
func sameMessage(got, want keyshared.Message, off uint64) string {
	want.Offset = off
	norm := func(m *keyshared.Message) {
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
