package connq

// Corking: a goroutine about to produce several frames for one connection in
// a run (the acknowledgements of a publisher's stores that JetStream answered
// together) corks it first, and uncorks it at the end of the run. Meanwhile
// nothing is written directly and the writer is not started; the uncork that
// ends the last cork starts it on the caller's goroutine, so the run's frames
// leave with one writev instead of one write each. A connection that closes
// or fails is never held back.

// Cork holds back the connection's writes until the matching Uncork. Corks
// nest: the writer starts when every one is undone.
func (c *Conn) Cork() {
	c.mu.Lock()
	c.mu.corked++
	c.mu.Unlock()
}

// Uncork undoes n Corks; when none is left, whatever was queued meanwhile is
// written (on this goroutine for a TCP connection with an idle writer).
func (c *Conn) Uncork(n int) {
	if n <= 0 {
		return
	}
	c.mu.Lock()
	c.mu.corked -= n
	if c.mu.corked < 0 {
		c.mu.corked = 0
	}
	start := c.mu.corked == 0 && c.mu.head < len(c.mu.q) // a closing or failed one was never held
	c.mu.Unlock()
	if start {
		c.kick()
	}
}
