package connq

import (
	"net"
	"sync"
	"syscall"
	"unsafe"
)

// A Flusher holds back the writers of the connections frames are queued on
// through it, so that frames due together leave together, and starts them
// when Flush is called: on the calling goroutine, when a connection's writer
// is idle, its frames go with one writev that never waits for the socket;
// whatever the socket does not take at once is left to the writer goroutine.
// A frame queued through a Flusher leaves no later than the next Flush (or
// earlier, when something else starts the connection's writer).
//
// It saves the hand-off to a new writer goroutine (and the wake-up of an
// idle thread to run it) for every connection that a burst of work touches:
// a group's dispatcher delivering to its members, or the acknowledgements
// of one commit of the group log released to their publishers. A Flusher is
// safe for concurrent use.
type Flusher struct {
	mu    sync.Mutex
	conns []*Conn
}

// Send is c.Send (a whole frame by reference, never dropped) with the
// connection's writer started by the next Flush.
func (f *Flusher) Send(c *Conn, b []byte) error {
	c.mu.Lock()
	err := c.queueLocked(entry{b: b, kind: kindSent}, false)
	c.mu.Unlock()
	if err == nil {
		f.add(c)
	}
	return err
}

// Release is h.Release with the connection's writer started by the next Flush.
func (f *Flusher) Release(h *Hold) {
	if h.decide(false, 0, false) {
		f.add(h.c)
	}
}

func (f *Flusher) add(c *Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, have := range f.conns {
		if have == c {
			return
		}
	}
	f.conns = append(f.conns, c)
}

// Flush writes what was queued through f since the last Flush.
func (f *Flusher) Flush() {
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for i, c := range conns {
		c.kick()
		conns[i] = nil
	}
	f.mu.Lock()
	if f.conns == nil {
		f.conns = conns[:0] // keep the backing array for the next round
	}
	f.mu.Unlock()
}

// kick starts the writer, on this goroutine (a direct write) when the
// connection is on TCP and the writer is idle.
func (c *Conn) kick() {
	c.mu.Lock()
	if c.mu.scheduled {
		c.mu.Unlock()
		return
	}
	c.mu.scheduled = true
	c.mu.Unlock()
	if c.tcpConn() == nil {
		go c.run()
		return
	}
	c.writeNow()
}

// writeNow is one round of the writer on the caller's goroutine, which holds
// the writer's turn (scheduled): it takes a batch and sends it with one
// writev that does not wait for the socket. The writer goroutine takes over
// what the socket did not take, and whatever was queued meanwhile.
func (c *Conn) writeNow() {
	bt := batchPool.Get().(*batch)
	res, wake := c.take(bt)
	switch res {
	case takeIdle:
		bt.release()
		return
	case takeDone:
		bt.release()
		go c.run() // it finishes the connection
		return
	}
	if wake != nil {
		wake()
	}
	bufs := c.build(bt)
	n, err := c.writevNow(bufs)
	switch {
	case err != nil:
		c.finishBatch(bt, err)
		go c.run()
		return
	case n < bufsLen(bufs):
		rest := append(net.Buffers(nil), bufs...)
		consume(&rest, n)
		go c.runFrom(bt, rest)
		return
	}
	c.finishBatch(bt, nil)
	c.stats.DirectWrites.Add(1)
	// More may have been queued while this batch was written: the writer
	// goroutine takes it (and gives the turn back when there is none).
	c.mu.Lock()
	more := c.mu.failed != nil || c.mu.closing || (c.mu.head < len(c.mu.q) && c.mu.connacked && !c.heldLocked())
	if !more {
		c.mu.scheduled = false
	}
	c.mu.Unlock()
	if more {
		go c.run()
	}
}

// maxIovecs is the most buffers one writev takes (Linux's IOV_MAX).
const maxIovecs = 1024

// writevNow writes bufs (up to maxIovecs of them) with one writev that does
// not wait for the socket, and returns how many bytes it took: fewer than
// all (none) when the socket's buffer is full.
func (c *Conn) writevNow(bufs net.Buffers) (int, error) {
	if c.raw == nil {
		rc, err := c.tcpConn().SyscallConn()
		if err != nil {
			return 0, nil // the writer goroutine writes it all
		}
		c.raw = rc
	}
	iov := make([]syscall.Iovec, 0, min(len(bufs), maxIovecs))
	for _, b := range bufs {
		if len(iov) == maxIovecs {
			break
		}
		if len(b) > 0 {
			v := syscall.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			iov = append(iov, v)
		}
	}
	if len(iov) == 0 {
		return 0, nil
	}
	var n uintptr
	var errno syscall.Errno
	err := c.raw.Write(func(fd uintptr) bool {
		// A raw system call: it never waits (a non-blocking descriptor),
		// and the runtime's entersyscall would wake its monitor thread
		// (see netpoll's readFD for what that cost).
		n, _, errno = syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		return true // never wait for the socket: the writer goroutine does that
	})
	switch {
	case err != nil:
		return 0, err
	case errno == syscall.EAGAIN || errno == syscall.EINTR:
		return 0, nil
	case errno != 0:
		return 0, &net.OpError{Op: "writev", Net: "tcp", Err: errno}
	}
	return int(n), nil
}

func bufsLen(v net.Buffers) int {
	n := 0
	for _, b := range v {
		n += len(b)
	}
	return n
}

// consume drops the first n bytes of v.
func consume(v *net.Buffers, n int) {
	for len(*v) > 0 && n > 0 {
		if l := len((*v)[0]); l > n {
			(*v)[0] = (*v)[0][n:]
			return
		} else {
			n -= l
		}
		(*v)[0] = nil
		*v = (*v)[1:]
	}
}
