package cluster

import (
	"sync"
	"time"
)

// pipe carries items to one destination in numbered batches, one batch at
// a time: a batch is sent again until it is answered (the receiver applies
// each number once), and the items pushed meanwhile go in the next batch.
// So items arrive in the order pushed, each once, across lost messages and
// NATS reconnects, as long as the destination lives. Its goroutine runs
// only while there is something to send.
type pipe[T any] struct {
	// send makes one request for the batch numbered seq and returns the
	// answer; an error means "try again".
	send func(seq uint64, items []T) ([]byte, error)
	// done gets each batch with its answer; a nil answer means the batch
	// was given up (the pipe was closed or abandon said so).
	done func(items []T, reply []byte)
	// abandon, if set, is asked after a failed send whether to give up.
	abandon func() bool
	// maxQueue bounds the items waiting; push refuses beyond it.
	maxQueue int
	maxBatch int

	mu struct {
		sync.Mutex
		queue   []T
		seq     uint64
		running bool
		closed  bool
	}
	stop chan struct{}
	wg   sync.WaitGroup
}

func newPipe[T any](send func(uint64, []T) ([]byte, error), done func([]T, []byte)) *pipe[T] {
	return &pipe[T]{send: send, done: done, maxQueue: 1 << 16, maxBatch: 512, stop: make(chan struct{})}
}

// push queues items; it reports false (and queues nothing) when the pipe is
// closed or its queue is full.
func (p *pipe[T]) push(items ...T) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.closed || len(p.mu.queue)+len(items) > p.maxQueue {
		return false
	}
	p.mu.queue = append(p.mu.queue, items...)
	if !p.mu.running {
		p.mu.running = true
		p.wg.Add(1)
		go p.run()
	}
	return true
}

// queued returns how many items wait.
func (p *pipe[T]) queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.mu.queue)
}

// close stops the pipe: a batch in flight is given up (done with nil) and
// nothing more is sent. It waits for the goroutine.
func (p *pipe[T]) close() []T {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return nil
	}
	p.mu.closed = true
	left := p.mu.queue
	p.mu.queue = nil
	p.mu.Unlock()
	close(p.stop)
	p.wg.Wait()
	return left
}

func (p *pipe[T]) run() {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		if len(p.mu.queue) == 0 || p.mu.closed {
			p.mu.running = false
			p.mu.Unlock()
			return
		}
		n := min(len(p.mu.queue), p.maxBatch)
		batch := append([]T(nil), p.mu.queue[:n]...)
		p.mu.queue = append(p.mu.queue[:0], p.mu.queue[n:]...)
		p.mu.seq++
		seq := p.mu.seq
		p.mu.Unlock()
		for attempt := 0; ; attempt++ {
			reply, err := p.send(seq, batch)
			if err == nil {
				p.done(batch, reply)
				break
			}
			if p.abandon != nil && p.abandon() {
				p.done(batch, nil)
				break
			}
			t := time.NewTimer(backoff(attempt))
			select {
			case <-p.stop:
				t.Stop()
				p.done(batch, nil)
				return
			case <-t.C:
			}
		}
	}
}
