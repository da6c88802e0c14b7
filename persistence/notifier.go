package persistence

import "sync"

// notifier runs completion callbacks and append notifications on one goroutine,
// in the order they were queued, so that neither the committer nor a caller
// ever runs user code while it holds store state. Its queue is unbounded: the
// committer must never wait for a callback.
type notifier struct {
	mu struct {
		sync.Mutex
		queue  []func()
		closed bool
	}
	wake chan struct{} // capacity 1: a pending wake-up
	done chan struct{} // closed when run returns
}

func newNotifier() *notifier {
	n := &notifier{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go n.run()
	return n
}

// push queues fn. It reports false once the notifier is closed.
func (n *notifier) push(fn func()) bool {
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

func (n *notifier) run() {
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

// close runs what is queued, then stops the goroutine and waits for it.
func (n *notifier) close() {
	n.mu.Lock()
	n.mu.closed = true
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
	<-n.done
}
