package ops

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// groupsIface is Groups under a name that is not one of its methods.
type groupsIface = Groups

// fakeDeadLetters is a group service holding one group's dead letters; it
// counts what the store was asked for.
type fakeDeadLetters struct {
	groupsIface
	letters []persistence.DeadLetterEntry
	maxRead int // the most letters one DeadLetters call asked for
}

func (f *fakeDeadLetters) Group(name string) (hooks.GroupStatus, error) {
	return hooks.GroupStatus{Info: persistence.GroupInfo{Name: name, DeadLetters: uint64(len(f.letters))}}, nil
}

func (f *fakeDeadLetters) DeadLetters(_ string, after uint64, limit int) ([]persistence.DeadLetterEntry, error) {
	f.maxRead = max(f.maxRead, limit)
	var out []persistence.DeadLetterEntry
	for _, e := range f.letters {
		if e.ID > after && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

// TestDeadLetterPageIsStreamedPreviewsWithinItsBytes: GET /api/v1/dlq reads
// the store a few letters at a time, answers previews, and stops before
// its byte bound (adminapi.MaxDLQPageBytes; lowered here) with more and next_after set, at least one
// letter a page.
func TestDeadLetterPageIsStreamedPreviewsWithinItsBytes(t *testing.T) {
	defer func(b int) { dlqPageBytes = b }(dlqPageBytes)
	dlqPageBytes = 256 << 10
	f := &fakeDeadLetters{}
	for i := range 40 { // 800 KB of topics: a few pages
		f.letters = append(f.letters, persistence.DeadLetterEntry{ID: uint64(i + 1), DeadLetter: keyshared.DeadLetter{Message: keyshared.Message{
			Topic: "big/" + strings.Repeat("t", 20_000), Key: fmt.Sprint(i), Payload: make([]byte, 100_000),
			Props: keyshared.Properties{CorrelationData: make([]byte, 10_000), User: []keyshared.UserProperty{{Key: "k", Val: strings.Repeat("v", 3000)}, {Key: "k", Val: strings.Repeat("w", 3000)}}},
		}}})
	}
	a := &groupAdmin{s: &Service{log: slog.New(slog.DiscardHandler)}, groups: f}
	mux := http.NewServeMux()
	a.register(mux)
	get := func(after uint64) (adminapi.DeadLetterPage, int) {
		t.Helper()
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("GET", fmt.Sprintf("%s?group=g%%2Fbig%%2F%%23&limit=1000&after=%d", adminapi.PathDLQ, after), nil))
		body, _ := io.ReadAll(w.Body)
		var p adminapi.DeadLetterPage
		if err := json.Unmarshal(body, &p); err != nil || w.Code != 200 {
			t.Fatalf("page after %d: %d %v\n%.300s", after, w.Code, err, body)
		}
		return p, len(body)
	}
	seen := 0
	for after := uint64(0); ; {
		p, size := get(after)
		if size > dlqPageBytes || len(p.DeadLetters) == 0 {
			t.Fatalf("a page of %d letters in %d bytes", len(p.DeadLetters), size)
		}
		for _, l := range p.DeadLetters {
			if !l.Truncated || len(l.Payload) > adminapi.MaxPreviewBytes || l.PayloadSize != 100_000 || len(l.UserProperties) != 1 || len(l.CorrelationData) > 400 {
				t.Fatalf("letter %d is not a preview: %d payload bytes, %d user properties, %d of correlation data", l.ID, len(l.Payload), len(l.UserProperties), len(l.CorrelationData))
			}
			if l.ID != uint64(seen+1) {
				t.Fatalf("letter %d after %d", l.ID, seen)
			}
			seen++
		}
		if !p.More {
			break
		}
		if p.NextAfter != uint64(seen) {
			t.Fatalf("next_after %d after %d letters", p.NextAfter, seen)
		}
		after = p.NextAfter
	}
	if seen != 40 || f.maxRead > dlqBatch+1 {
		t.Fatalf("%d letters in all; the store was asked for %d at once", seen, f.maxRead)
	}
}
