package connq

import "time"

// Hooks for an owner that reads the connection itself, without a blocking
// Read (package netpoll): it must learn when the connection is closed or
// cut, when it is finished, and what read deadline mochi set, since no
// blocked read returns an error to tell it.

// Watch makes the connection call onClose (once) when it is closed or cut
// (Close, a slow consumer, a failed write) and onDeadline when its read
// deadline changes; set before the connection is used. onClose is called
// with the queue's lock held, onDeadline from SetDeadline's caller: neither
// may block or call the Conn. With Watch, SetDeadline no longer sets the underlying
// connection's read deadline (no runtime timer per connection): the owner
// enforces ReadDeadline.
func (c *Conn) Watch(onClose func(), onDeadline func(time.Time)) {
	c.mu.Lock()
	c.mu.onClose = onClose
	c.onDeadline = onDeadline
	c.mu.Unlock()
}

// ReadDeadline returns the read deadline in force (zero: none).
func (c *Conn) ReadDeadline() time.Time {
	if d := c.readDeadline.Load(); d != 0 {
		return time.Unix(0, d)
	}
	return time.Time{}
}

// AfterDone calls f once the connection is finished (as Done reports),
// from the writer's goroutine, or at once if it is finished already.
func (c *Conn) AfterDone(f func()) {
	c.mu.Lock()
	if !c.mu.finished {
		c.mu.afterDone = f
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	f()
}

// Closing reports whether the connection has been closed or cut.
func (c *Conn) Closing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.closing || c.mu.failed != nil
}

// notifyCloseLocked tells the watcher, once, that the connection is closing.
func (c *Conn) notifyCloseLocked() {
	if f := c.mu.onClose; f != nil {
		c.mu.onClose = nil
		f()
	}
}

// finish marks the connection finished and runs the AfterDone callback.
func (c *Conn) finish() {
	c.mu.Lock()
	c.mu.finished = true
	if c.mu.holdTimer != nil {
		c.mu.holdTimer.Stop()
	}
	f := c.mu.afterDone
	c.mu.afterDone = nil
	if c.mu.done != nil {
		close(c.mu.done)
	}
	c.mu.Unlock()
	if f != nil {
		f()
	}
}
