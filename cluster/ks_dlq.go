package cluster

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/keyline-mq/keyline/keyshared"
)

// Dead letters live in the stream KL_DLQ, one subject per group
// (kl.x.<hash>); a dead letter's id is its stream sequence, so ids only
// grow and are never reused, and any node lists, replays and purges them.

func (g *Groups) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*g.node.cfg.RequestTimeout)
}

// storeDeadLetter stores an encoded dead letter (retrying through a leader
// election) and returns its id.
func (g *Groups) storeDeadLetter(gh string, data []byte, id string) (uint64, error) {
	deadline := time.Now().Add(g.node.cfg.PublishTimeout)
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), g.node.cfg.RequestTimeout)
		ack, err := g.node.js.Publish(ctx, dlqSubject(gh), data, jetstream.WithMsgID(id), jetstream.WithExpectStream(StreamDLQ))
		cancel()
		if err == nil {
			return ack.Sequence, nil
		}
		if time.Now().After(deadline) || g.stopped() {
			return 0, fmt.Errorf("cluster: dead letter not stored: %w", err)
		}
		if !sleepOr(g.stop, backoff(attempt)) {
			return 0, ErrNotReady
		}
	}
}

// eachDeadLetter calls fn for the group's dead letters with id >= from, in
// id order, until fn returns false.
func (g *Groups) eachDeadLetter(ctx context.Context, gh string, from uint64, fn func(id uint64, d keyshared.DeadLetter) bool) error {
	s, err := g.node.js.Stream(ctx, StreamDLQ)
	if err != nil {
		return fmt.Errorf("cluster: dead letters: %w", err)
	}
	for seq := max(from, 1); ; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(dlqSubject(gh)))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("cluster: dead letters: %w", err)
		}
		d, _, err := keyshared.DecodeDeadLetter(m.Data, true)
		if err != nil {
			g.log.Warn("key-shared: undecodable dead letter skipped", "id", m.Sequence, "error", err)
		} else if !fn(m.Sequence, d) {
			return nil
		}
		seq = m.Sequence + 1
	}
}

// deadLetterCount counts the group's dead letters.
func (g *Groups) deadLetterCount(ctx context.Context, gh string) (uint64, error) {
	s, err := g.node.js.Stream(ctx, StreamDLQ)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(dlqSubject(gh)))
	if err != nil {
		return 0, err
	}
	return info.State.Subjects[dlqSubject(gh)], nil
}

// DeadLetters implements keyshared.Backend.
func (g *Groups) DeadLetters(group string, after uint64, limit int) ([]keyshared.DeadLetterEntry, error) {
	gh, err := g.known(group)
	if err != nil {
		return nil, err
	}
	ctx, cancel := g.ctx()
	defer cancel()
	var out []keyshared.DeadLetterEntry
	err = g.eachDeadLetter(ctx, gh, after+1, func(id uint64, d keyshared.DeadLetter) bool {
		d.Group = group
		out = append(out, keyshared.DeadLetterEntry{ID: id, DeadLetter: d})
		return len(out) < limit
	})
	return out, err
}

// DeadLetter implements keyshared.Backend.
func (g *Groups) DeadLetter(group string, id uint64) (keyshared.DeadLetterEntry, error) {
	gh, err := g.known(group)
	if err != nil {
		return keyshared.DeadLetterEntry{}, err
	}
	ctx, cancel := g.ctx()
	defer cancel()
	s, err := g.node.js.Stream(ctx, StreamDLQ)
	if err != nil {
		return keyshared.DeadLetterEntry{}, err
	}
	m, err := s.GetMsg(ctx, id)
	if errors.Is(err, jetstream.ErrMsgNotFound) || (err == nil && m.Subject != dlqSubject(gh)) {
		return keyshared.DeadLetterEntry{}, fmt.Errorf("%w: %d in %q", keyshared.ErrDeadLetterNotFound, id, group)
	}
	if err != nil {
		return keyshared.DeadLetterEntry{}, err
	}
	d, _, err := keyshared.DecodeDeadLetter(m.Data, true)
	if err != nil {
		return keyshared.DeadLetterEntry{}, err
	}
	d.Group = group
	return keyshared.DeadLetterEntry{ID: id, DeadLetter: d}, nil
}

// DeleteDeadLetter implements keyshared.Backend.
func (g *Groups) DeleteDeadLetter(group string, id uint64) error {
	if _, err := g.DeadLetter(group, id); err != nil {
		return err
	}
	ctx, cancel := g.ctx()
	defer cancel()
	s, err := g.node.js.Stream(ctx, StreamDLQ)
	if err != nil {
		return err
	}
	if err := s.DeleteMsg(ctx, id); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return err
	}
	return nil
}

// ReplayDeadLetter implements keyshared.Backend: the message goes back
// at the log's tail (once: a retried replay has the same message id), then
// the dead letter is deleted.
func (g *Groups) ReplayDeadLetter(group string, id uint64) (uint64, error) {
	e, err := g.DeadLetter(group, id)
	if err != nil {
		return 0, err
	}
	gh := groupHash(group)
	m := e.Message
	m.Offset = 0
	type res struct {
		off uint64
		err error
	}
	ch := make(chan res, 1)
	g.appends.append(gh, m.Key, "replay-"+gh+"-"+strconv.FormatUint(id, 10), keyshared.EncodeMessage(&m), func(off uint64, err error) {
		ch <- res{off, err}
	})
	r := <-ch
	if r.err != nil {
		return 0, r.err
	}
	return r.off, g.DeleteDeadLetter(group, id)
}

// PurgeDeadLetters implements keyshared.Backend.
func (g *Groups) PurgeDeadLetters(group string) (int, error) {
	gh, err := g.known(group)
	if err != nil {
		return 0, err
	}
	ctx, cancel := g.ctx()
	defer cancel()
	n, err := g.deadLetterCount(ctx, gh)
	if err != nil {
		return 0, err
	}
	s, err := g.node.js.Stream(ctx, StreamDLQ)
	if err != nil {
		return 0, err
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(dlqSubject(gh))); err != nil {
		return 0, err
	}
	return int(n), nil
}
