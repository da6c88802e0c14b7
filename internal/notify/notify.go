// Package notify runs callbacks in order on a goroutine of their own, away
// from the state of whoever queues them (the segment log's writer, the
// in-memory group store's committer).
package notify

import "sync"

// Notifier runs callbacks on one goroutine, in the order they were queued,
// so that a committer or writer never runs user code while it holds its
// state. Its queue is unbounded: the producer never waits for a callback.
type Notifier struct {
	mu struct {
		sync.Mutex
		queue  []func()
		closed bool
	}
	wake chan struct{} // capacity 1
	done chan struct{} // closed when run returns
}

// New starts a notifier's goroutine.
func New() *Notifier {
	n := &Notifier{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go n.run()
	return n
}

// Push queues fn; it reports false once the notifier is closed.
func (n *Notifier) Push(fn func()) bool {
	n.mu.Lock()
	if n.mu.closed {
		n.mu.Unlock()
		return false
	}
	n.mu.queue = append(n.mu.queue, fn)
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
	return true
}

func (n *Notifier) run() {
	defer close(n.done)
	var batch []func()
	for {
		n.mu.Lock()
		batch, n.mu.queue = n.mu.queue, batch[:0]
		closed := n.mu.closed
		n.mu.Unlock()
		for i, fn := range batch {
			fn()
			batch[i] = nil
		}
		if len(batch) == 0 {
			if closed {
				return
			}
			<-n.wake
		}
	}
}

// Close runs what is queued, then stops the goroutine; wait says whether to
// wait for it. A callback passes false: waiting for the goroutine that runs
// it would never end.
func (n *Notifier) Close(wait bool) {
	n.mu.Lock()
	n.mu.closed = true
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
	if wait {
		<-n.done
	}
}
