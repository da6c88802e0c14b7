package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Making a cluster start every time. Nodes start together (systemd,
// compose files and Kubernetes start them at once) against NATS clusters
// that are fresh, restarting or one server short, so everything a node
// needs from JetStream is made idempotently and waited for:
//
//   - one NATS connection for the node's life: it is never closed and
//     reopened to retry a request (nats.RetryOnFailedConnect keeps trying
//     servers in the background until one answers);
//   - a stream or bucket is looked up first and created only if absent;
//     when present, its configuration is compared with the one wanted and
//     updated only on a real difference (never "create or update" blindly);
//   - NATS answers only one of several identical creates of a clustered
//     stream sent at the same moment (nats-server#3677, nats.go#949: the
//     stream assignment keeps one reply subject, the others are never
//     answered), so while a create is in flight the node keeps asking for
//     the stream's info: another node's create may have made it;
//   - a JetStream request sent before the NATS cluster has a meta leader
//     gets no answer at all: every request has its own timeout and is tried
//     again, with backoff, until the start deadline (--nats-start-timeout);
//   - what the node waits for, and NATS's last answer, is logged when the
//     wait begins and every few seconds while it lasts; at the deadline
//     the error names what never became available.

// waitLogEvery is how often a node repeats that it still waits for something.
const waitLogEvery = 5 * time.Second

// startWait logs what a node waits for while it starts. Safe for
// concurrent use (the streams and buckets are made in parallel).
type startWait struct {
	log   *slog.Logger
	begin time.Time

	mu     sync.Mutex
	since  map[string]time.Time // thing -> when the wait for it began
	logged map[string]time.Time // thing -> when it was last logged
}

func newStartWait(log *slog.Logger) *startWait {
	return &startWait{log: log, begin: time.Now(), since: map[string]time.Time{}, logged: map[string]time.Time{}}
}

// waiting records that what is not available yet (NATS said err) and
// logs it when the wait begins and every waitLogEvery after.
func (w *startWait) waiting(what string, err error) {
	now := time.Now()
	w.mu.Lock()
	if _, ok := w.since[what]; !ok {
		w.since[what] = now
	}
	last, logged := w.logged[what]
	if logged && now.Sub(last) < waitLogEvery {
		w.mu.Unlock()
		return
	}
	w.logged[what] = now
	waited := now.Sub(w.since[what])
	w.mu.Unlock()
	w.log.Info("waiting for NATS JetStream", "for", what, "waited", waited.Round(time.Millisecond), "nats_said", errText(err))
}

// ready records that what is available; a wait that was logged gets a
// line saying how long it took.
func (w *startWait) ready(what string) {
	w.mu.Lock()
	since, waited := w.since[what]
	_, logged := w.logged[what]
	delete(w.since, what)
	delete(w.logged, what)
	w.mu.Unlock()
	if waited && logged {
		w.log.Info("NATS JetStream ready", "for", what, "waited", time.Since(since).Round(time.Millisecond))
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// startBackoff is the pause before try attempt+1 of a start step: from 50
// ms doubling to 1 s, with jitter so that nodes started together spread out.
func startBackoff(attempt int) time.Duration {
	d := min(50*time.Millisecond<<min(attempt, 5), time.Second)
	return d/2 + rand.N(d/2+1)
}

// tryTimeout bounds try attempt of a start step: 0.5, 1 and 2 s in turn
// (at most RequestTimeout). A request that NATS drops (no meta leader
// yet) costs only its bound, so short bounds notice a NATS cluster that
// became ready soon; the longer ones let a slow answer (a loaded machine)
// arrive.
func (n *Node) tryTimeout(attempt int) time.Duration {
	return min(500*time.Millisecond<<(attempt%3), n.cfg.RequestTimeout)
}

// retryStart runs try until it succeeds or ctx ends, pausing with
// startBackoff between tries and logging the wait for what. Each try gets
// its own timeout (tryTimeout). At the end of ctx the error names what
// and NATS's last answer.
func (n *Node) retryStart(ctx context.Context, w *startWait, what string, try func(ctx context.Context) error) error {
	var last error
	for attempt := 0; ; attempt++ {
		bound := n.tryTimeout(attempt)
		rctx, cancel := context.WithTimeout(ctx, bound)
		err := try(rctx)
		cancel()
		if err == nil {
			w.ready(what)
			return nil
		}
		switch {
		case !isContextErr(err):
			last = err
		case ctx.Err() == nil: // the try's own bound
			last = fmt.Errorf("no answer within %s (%w)", bound, err)
		case last == nil: // a try cut short by the deadline says less than the one before
			last = err
		}
		w.waiting(what, last)
		t := time.NewTimer(startBackoff(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s not available after %s: %w", what, time.Since(w.begin).Round(100*time.Millisecond), last)
		case <-n.stop:
			t.Stop()
			return ErrNotReady
		case <-t.C:
		}
	}
}

func isContextErr(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// waitConnected waits until the node's connection has reached a NATS server.
func (n *Node) waitConnected(ctx context.Context, w *startWait) error {
	what := "a NATS server at " + strings.Join(n.cfg.URLs, ",")
	return n.retryStart(ctx, w, what, func(context.Context) error {
		if n.nc.IsConnected() {
			return nil
		}
		if err := n.nc.LastError(); err != nil {
			return err
		}
		return nats.ErrNoServers
	})
}

// ensureStream makes stream want.Name exist with want's configuration (see
// the top of this file) and waits until it does.
func (n *Node) ensureStream(ctx context.Context, w *startWait, want jetstream.StreamConfig) error {
	what := fmt.Sprintf("stream %s (%d replicas)", want.Name, max(want.Replicas, 1))
	return n.retryStart(ctx, w, what, func(ctx context.Context) error { return n.ensureStreamOnce(ctx, want) })
}

// errCreating: a create is in flight and NATS has not placed the stream yet.
var errCreating = errors.New("stream being created")

// ensureStreamOnce looks the stream up, then creates or updates it. A
// create that NATS does not answer within ctx may still be in progress (or
// another node's identical create won): the next try asks for the info first.
func (n *Node) ensureStreamOnce(ctx context.Context, want jetstream.StreamConfig) error {
	s, err := n.js.Stream(ctx, want.Name)
	switch {
	case err == nil:
		diff := streamDiff(s.CachedInfo().Config, want)
		if len(diff) == 0 {
			return nil
		}
		n.log.Info("updating a stream whose configuration differs", "stream", want.Name, "fields", strings.Join(diff, ","))
		_, err = n.js.UpdateStream(ctx, want)
		return err
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return err
	}
	return n.createWatching(ctx, want)
}

// createWatching sends the create and, until it is answered, asks for the
// stream's info every few hundred milliseconds: when another node's create
// made the stream, this one's answer may never come.
func (n *Node) createWatching(ctx context.Context, want jetstream.StreamConfig) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	created := make(chan error, 1)
	go func() {
		_, err := n.js.CreateStream(cctx, want)
		created <- err
	}()
	for poll := 100 * time.Millisecond; ; poll = min(2*poll, 500*time.Millisecond) {
		t := time.NewTimer(poll)
		select {
		case err := <-created:
			t.Stop()
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				return errCreating // made by someone else meanwhile, maybe differently: look again
			}
			return err
		case <-t.C:
		}
		// While a new stream elects its leader nobody answers its info:
		// each look gets a short bound of its own.
		pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		s, err := n.js.Stream(pctx, want.Name)
		pcancel()
		if err == nil && len(streamDiff(s.CachedInfo().Config, want)) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", errCreating, ctx.Err())
		}
	}
}

// ensureBucket makes a KV bucket exist as ensureStream makes its stream,
// and binds it.
func (n *Node) ensureBucket(ctx context.Context, w *startWait, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if err := n.ensureStream(ctx, w, bucketStream(cfg)); err != nil {
		return nil, err
	}
	var kv jetstream.KeyValue
	err := n.retryStart(ctx, w, "bucket "+cfg.Bucket, func(ctx context.Context) (err error) {
		kv, err = n.js.KeyValue(ctx, cfg.Bucket)
		return err
	})
	return kv, err
}

// bucketStream is the stream nats.go makes for a KV bucket (jetstream
// prepareKeyValueConfig, nats.go v1.55.0) from the settings Keyline uses.
func bucketStream(cfg jetstream.KeyValueConfig) jetstream.StreamConfig {
	sc := jetstream.StreamConfig{
		Name:              "KV_" + cfg.Bucket,
		Description:       cfg.Description,
		Subjects:          []string{"$KV." + cfg.Bucket + ".>"},
		MaxMsgsPerSubject: int64(max(cfg.History, 1)),
		MaxBytes:          -1,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           cfg.Storage,
		Replicas:          max(cfg.Replicas, 1),
		AllowRollup:       true,
		DenyDelete:        true,
		AllowDirect:       true,
		Duplicates:        2 * time.Minute,
		Discard:           jetstream.DiscardNew,
	}
	if cfg.LimitMarkerTTL > 0 {
		sc.AllowMsgTTL, sc.SubjectDeleteMarkerTTL = true, cfg.LimitMarkerTTL
	}
	return sc
}

// streamDiff names the settings Keyline chooses in which have differs from
// want (the server fills in defaults for the rest: those never count).
func streamDiff(have, want jetstream.StreamConfig) []string {
	limit := func(v int64) int64 { // 0 and -1 both mean no limit
		if v <= 0 {
			return -1
		}
		return v
	}
	dup := func(d time.Duration) time.Duration {
		if d == 0 {
			return 2 * time.Minute // the server's default
		}
		return d
	}
	var out []string
	add := func(differs bool, name string) {
		if differs {
			out = append(out, name)
		}
	}
	hs, ws := slices.Clone(have.Subjects), slices.Clone(want.Subjects)
	slices.Sort(hs)
	slices.Sort(ws)
	add(!slices.Equal(hs, ws), "subjects")
	add(have.Description != want.Description, "description")
	add(have.Retention != want.Retention, "retention")
	add(have.Storage != want.Storage, "storage")
	add(max(have.Replicas, 1) != max(want.Replicas, 1), "replicas")
	add(limit(have.MaxMsgs) != limit(want.MaxMsgs), "max_msgs")
	add(limit(have.MaxBytes) != limit(want.MaxBytes), "max_bytes")
	add(have.MaxAge != want.MaxAge, "max_age")
	add(limit(have.MaxMsgsPerSubject) != limit(want.MaxMsgsPerSubject), "max_msgs_per_subject")
	add(limit(int64(have.MaxMsgSize)) != limit(int64(want.MaxMsgSize)), "max_msg_size")
	add(have.Discard != want.Discard, "discard")
	add(dup(have.Duplicates) != dup(want.Duplicates), "duplicate_window")
	add(have.AllowDirect != want.AllowDirect, "allow_direct")
	add(have.AllowRollup != want.AllowRollup, "allow_rollup_hdrs")
	add(have.DenyDelete != want.DenyDelete, "deny_delete")
	add(have.AllowMsgTTL != want.AllowMsgTTL, "allow_msg_ttl")
	add(have.SubjectDeleteMarkerTTL != want.SubjectDeleteMarkerTTL, "subject_delete_marker_ttl")
	return out
}
