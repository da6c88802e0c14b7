// Command keyed-worker is an MQTT 5 member of a Key-Shared group: it
// subscribes to $share/<group>/<filter>, processes each message, acks it
// (PUBACK), nacks it on failure (PUBACK 0x80: the broker retries after its
// backoff) or rejects it (PUBACK 0x99: dead-lettered at once), and checks that
// every key's sequence numbers arrive in order.
//
// The broker hands each key to one member at a time, in publish order, so per
// key a worker sees: the next sequence number (in order); the one it nacked,
// again (a retry); a jump forward (a gap: the key came from another member, or
// messages were dead-lettered); a number it saw dead-lettered, again (a
// replay, after `keyline dlq replay`); a number it acked, again (a duplicate:
// delivery is at-least-once, e.g. after a broker restart). A number that a gap
// skipped, arriving later, is out of order: it is printed as ORDER and makes
// the worker exit with status 3.
//
// Sequence numbers are read from a JSON payload's "seq" field (what
// examples/device-fleet sends) or from a payload that is just a number. The
// key is the MQTT 5 user property "key", else the topic, as the broker's
// default --key-property has it.
//
//	go run ./examples/keyed-worker --group workers --filter 'telemetry/#' --id w1
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/spf13/pflag"
)

// options are the command-line flags.
type options struct {
	broker        string
	group, filter string
	id            string
	keyFilters    []string
	qos           int
	failEvery     int
	rejectEvery   int
	process       time.Duration
	concurrency   int
	receiveMax    int
	sessionExpiry time.Duration
	username      string
	password      string
	count         int
	report        time.Duration
	verbose       bool
}

func parseFlags(args []string, errOut io.Writer) (options, error) {
	o := options{}
	fs := pflag.NewFlagSet("keyed-worker", pflag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.StringVar(&o.broker, "broker", "tcp://127.0.0.1:1883", "broker address, host:port or tcp://host:port")
	fs.StringVar(&o.group, "group", "workers", "share name: the worker subscribes to $share/<group>/<filter>")
	fs.StringVar(&o.filter, "filter", "telemetry/#", "topic filter of the group")
	fs.StringVar(&o.id, "id", fmt.Sprintf("worker-%d", os.Getpid()), "MQTT client id")
	fs.StringArrayVar(&o.keyFilters, "key-filter", nil, "only take keys matching this glob (* and ?); repeatable; none: every key")
	fs.IntVar(&o.qos, "qos", 1, "maximum QoS of the subscription (1 or 2; 0 gets no acks, retries or order guarantees)")
	fs.IntVar(&o.failEvery, "fail-every", 0, "nack (0x80, retried after backoff) every Nth message processed; 0: never")
	fs.IntVar(&o.rejectEvery, "reject-every", 0, "reject (0x99, dead-lettered at once) every Nth message processed; 0: never")
	fs.DurationVar(&o.process, "process-time", 0, "time spent processing each message")
	fs.IntVar(&o.concurrency, "concurrency", 4, "messages processed at once (different keys; the broker sends one per key at a time)")
	fs.IntVar(&o.receiveMax, "receive-maximum", 0, "MQTT 5 Receive Maximum: messages the broker may have unacked at this worker; 0: twice --concurrency")
	fs.DurationVar(&o.sessionExpiry, "session-expiry", 0, "MQTT 5 session expiry: >0 lets a reconnect within the eviction grace resume the in-flight messages")
	fs.StringVar(&o.username, "username", "", "user name (auth ledger)")
	fs.StringVar(&o.password, "password", "", "password (auth ledger)")
	fs.IntVar(&o.count, "count", 0, "exit after acking this many messages; 0: run until interrupted")
	fs.DurationVar(&o.report, "report", 5*time.Second, "print the counters this often; 0: only at exit")
	fs.BoolVarP(&o.verbose, "verbose", "v", false, "print every message")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.group == "" || strings.ContainsAny(o.group, "/+#"):
		return o, fmt.Errorf("--group %q: want a share name without /, + or #", o.group)
	case o.filter == "":
		return o, errors.New("--filter is empty")
	case o.qos < 0 || o.qos > 2:
		return o, fmt.Errorf("--qos %d: want 0, 1 or 2", o.qos)
	case o.failEvery < 0 || o.rejectEvery < 0 || o.count < 0:
		return o, errors.New("--fail-every, --reject-every and --count must not be negative")
	case o.concurrency < 1:
		return o, errors.New("--concurrency must be at least 1")
	case o.receiveMax < 0 || o.receiveMax > 65535:
		return o, fmt.Errorf("--receive-maximum %d: want 0-65535", o.receiveMax)
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "keyed-worker: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := run(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "keyed-worker: %v\n", err)
		os.Exit(1)
	}
	if s.Violations > 0 {
		os.Exit(3)
	}
}

// Summary counts what a worker did.
type Summary struct {
	Received   int // deliveries, retries included
	Acked      int
	Nacked     int // 0x80: the broker retries
	Rejected   int // 0x99: the broker dead-letters
	AckErrors  int // answers lost with the connection (the broker redelivers)
	Keys       int // distinct keys seen
	InOrder    int // the key's next sequence number (or its first)
	Retries    int // the sequence number this worker nacked, again
	Replays    int // a sequence number this worker saw dead-lettered, again (keyline dlq replay)
	Duplicates int // a sequence number this worker acked before, again (at-least-once: after a restart or a lost ack)
	Gaps       int // a jump forward (a key taken over, or messages dead-lettered elsewhere)
	Violations int // a sequence number skipped by a gap arriving later: out of order
	NoSeq      int // payloads without a sequence number
	Reconnects int
}

func (s Summary) String() string {
	return fmt.Sprintf("received=%d acked=%d nacked=%d rejected=%d keys=%d in-order=%d retries=%d replays=%d duplicates=%d gaps=%d order-violations=%d",
		s.Received, s.Acked, s.Nacked, s.Rejected, s.Keys, s.InOrder, s.Retries, s.Replays, s.Duplicates, s.Gaps, s.Violations)
}

// maxTracked bounds the sequence numbers remembered per key and kind.
const maxTracked = 10000

// keyState is what the worker knows of one key. Every number up to acked
// was acked here, dead-lettered (dead), or skipped by a gap (skipped).
type keyState struct {
	acked   int64 // highest sequence number resolved here (valid when seen)
	seen    bool
	nacked  int64              // sequence number last nacked, -1: none
	dead    map[int64]struct{} // rejected here, or nacked here and then passed over
	skipped map[int64]struct{} // jumped over by a gap, never seen
}

func (ks *keyState) mark(set *map[int64]struct{}, seq int64) {
	if *set == nil {
		*set = map[int64]struct{}{}
	}
	if len(*set) < maxTracked {
		(*set)[seq] = struct{}{}
	}
}

// classify files seq, just received for ks, and returns the verdict.
func (wk *worker) classify(key string, ks *keyState, seq int64, topic string) string {
	if ks.nacked >= 0 && seq > ks.nacked {
		// The key went on past the message we nacked: it was dead-lettered
		// (or dropped) after its last attempt.
		ks.mark(&ks.dead, ks.nacked)
		ks.acked, ks.seen = max(ks.acked, ks.nacked), true
		ks.nacked = -1
	}
	switch {
	case seq == ks.nacked:
		wk.s.Retries++
		return "retry"
	case !ks.seen || seq == ks.acked+1:
		wk.s.InOrder++
		return "in-order"
	case seq > ks.acked+1:
		wk.s.Gaps++
		for n := ks.acked + 1; n < seq && n-ks.acked <= maxTracked; n++ {
			ks.mark(&ks.skipped, n)
		}
		return fmt.Sprintf("gap: %d to %d", ks.acked, seq)
	}
	if _, ok := ks.dead[seq]; ok {
		delete(ks.dead, seq)
		wk.s.Replays++
		return "replayed dead letter"
	}
	if _, ok := ks.skipped[seq]; ok {
		delete(ks.skipped, seq)
		wk.s.Violations++
		fmt.Fprintf(wk.out, "ORDER key=%s seq=%d arrived after seq %d (topic %s)\n", key, seq, ks.acked, topic)
		return fmt.Sprintf("ORDER: after %d", ks.acked)
	}
	wk.s.Duplicates++
	return "duplicate"
}

// worker holds the counters and per-key state shared by the processing goroutines.
type worker struct {
	o   options
	out io.Writer

	mu        sync.Mutex
	s         Summary
	keys      map[string]*keyState
	processed int
	done      chan struct{} // closed when --count acks are reached
	doneOnce  sync.Once
}

func (wk *worker) printf(format string, a ...any) {
	wk.mu.Lock()
	defer wk.mu.Unlock()
	fmt.Fprintf(wk.out, format, a...)
}

// seqOf reads the sequence number of a payload.
func seqOf(payload []byte) (int64, bool) {
	var v struct {
		Seq *int64 `json:"seq"`
	}
	if json.Unmarshal(payload, &v) == nil && v.Seq != nil {
		return *v.Seq, true
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(payload)), 10, 64)
	return n, err == nil
}

// handle processes one message and answers it.
func (wk *worker) handle(c *conn, m *paho.Publish) {
	key := m.Topic
	if m.Properties != nil {
		if k := m.Properties.User.Get("key"); k != "" {
			key = k
		}
	}
	seq, hasSeq := seqOf(m.Payload)

	wk.mu.Lock()
	wk.s.Received++
	ks := wk.keys[key]
	if ks == nil {
		ks = &keyState{nacked: -1}
		wk.keys[key] = ks
		wk.s.Keys++
	}
	verdict := "no-seq"
	if hasSeq {
		verdict = wk.classify(key, ks, seq, m.Topic)
	} else {
		wk.s.NoSeq++
	}
	wk.processed++
	n := wk.processed
	wk.mu.Unlock()

	if wk.o.process > 0 {
		time.Sleep(wk.o.process) // the work itself
	}

	action, reason := "ack", ReasonSuccess
	switch {
	case wk.o.rejectEvery > 0 && n%wk.o.rejectEvery == 0:
		action, reason = "reject 0x99", ReasonPayloadFormatInvalid
	case wk.o.failEvery > 0 && n%wk.o.failEvery == 0:
		action, reason = "nack 0x80", ReasonUnspecifiedError
	}
	// Record the outcome before answering: the answer frees the key, and its
	// next message may be in another goroutine's hands a moment later.
	wk.mu.Lock()
	if wk.o.verbose {
		fmt.Fprintf(wk.out, "key=%s seq=%d topic=%s qos=%d %s -> %s\n", key, seq, m.Topic, m.QoS, verdict, action)
	}
	wk.record(ks, seq, hasSeq, reason)
	wk.mu.Unlock()

	if err := c.answer(m, reason); err != nil {
		// The connection is gone: the broker delivers the message again
		// (here after a reconnect, as a duplicate, or to another member).
		wk.mu.Lock()
		wk.s.AckErrors++
		wk.mu.Unlock()
	}
}

// record files the answer to a message of ks; wk.mu is held.
func (wk *worker) record(ks *keyState, seq int64, hasSeq bool, reason byte) {
	switch reason {
	case ReasonSuccess:
		wk.s.Acked++
		if hasSeq && (!ks.seen || seq > ks.acked) {
			ks.acked, ks.seen = seq, true
		}
		if seq == ks.nacked {
			ks.nacked = -1
		}
		if wk.o.count > 0 && wk.s.Acked >= wk.o.count {
			wk.doneOnce.Do(func() { close(wk.done) })
		}
	case ReasonPayloadFormatInvalid:
		wk.s.Rejected++
		if hasSeq { // dead-lettered: the key moves on past it
			ks.mark(&ks.dead, seq)
			if !ks.seen || seq > ks.acked {
				ks.acked, ks.seen = seq, true
			}
			if seq == ks.nacked {
				ks.nacked = -1
			}
		}
	default:
		wk.s.Nacked++
		if hasSeq {
			ks.nacked = seq
		}
	}
}

// connect dials the broker and subscribes to the group (conn.go).
func (wk *worker) connect(ctx context.Context, sess *answerSession) (*conn, error) {
	o := wk.o
	addr := strings.TrimPrefix(o.broker, "tcp://")
	receiveMax := o.receiveMax
	if receiveMax == 0 {
		receiveMax = min(2*o.concurrency, 65535)
	}
	sub := "$share/" + o.group + "/" + o.filter
	c, rc, err := dial(ctx, sess, dialOptions{
		addr: addr, clientID: o.id, username: o.username, password: o.password,
		receiveMax: uint16(receiveMax), sessionExpiry: uint32(o.sessionExpiry / time.Second),
		filter: sub, qos: byte(o.qos), keyFilters: o.keyFilters, buffer: o.concurrency,
	})
	if err != nil {
		return nil, err
	}
	kf := "every key"
	if len(o.keyFilters) > 0 {
		kf = "keys " + strings.Join(o.keyFilters, ", ")
	}
	wk.printf("%s: connected to %s (session present %v), member of %s with QoS %d, %s\n",
		o.id, addr, c.sessionPresent, sub, rc, kf)
	return c, nil
}

// run works until ctx ends or --count messages are acked, reconnecting when
// the connection drops, and returns the counters.
func run(ctx context.Context, o options, out io.Writer) (Summary, error) {
	wk := &worker{o: o, out: out, keys: map[string]*keyState{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer bg.Wait()
	defer cancel()
	bg.Go(func() {
		select {
		case <-wk.done:
			cancel()
		case <-ctx.Done():
		}
	})
	if o.report > 0 {
		bg.Go(func() {
			t := time.NewTicker(o.report)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					wk.printf("%s: %s\n", o.id, wk.summary())
				case <-ctx.Done():
					return
				}
			}
		})
	}

	var lastErr error
	sess := newAnswerSession() // outlives each connection, as the broker's session does
	defer sess.Close()
	for first := true; ctx.Err() == nil; first = false {
		c, err := wk.connect(ctx, sess)
		if err != nil {
			if first {
				return wk.summary(), err // a mistake (address, credentials, filter): say so at once
			}
			lastErr = err
			wk.printf("%s: reconnect failed: %v\n", o.id, err)
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
			}
			continue
		}
		if !first {
			wk.mu.Lock()
			wk.s.Reconnects++
			wk.mu.Unlock()
		}
		var wg sync.WaitGroup
		for range o.concurrency {
			wg.Go(func() {
				for {
					select {
					case m := <-c.msgs:
						if ctx.Err() == nil { // stopping: leave it unanswered, the broker gives it to another member
							wk.handle(c, m)
						}
					case <-c.quit:
						return
					}
				}
			})
		}
		select {
		case <-ctx.Done():
		case <-c.quit:
			wk.printf("%s: connection lost: %v; reconnecting\n", o.id, c.err())
		}
		c.close()
		wg.Wait()
		lastErr = nil
	}
	s := wk.summary()
	fmt.Fprintf(out, "%s: done: %s\n", o.id, s)
	if lastErr != nil && s.Received == 0 {
		return s, lastErr
	}
	return s, nil
}

func (wk *worker) summary() Summary {
	wk.mu.Lock()
	defer wk.mu.Unlock()
	return wk.s
}
