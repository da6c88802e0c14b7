package connq

// Inspector sees every byte a client sends, in order, before the reader
// (mochi) does: it finds what must end the connection in what the reader
// would accept. It is called from the reading goroutine only.
type Inspector interface {
	// Inspect is given the bytes of each read. Without an error it passes
	// them all (returns len(b)). With one, it returns how many bytes of b
	// to pass before the connection ends, and the frame that tells the
	// client why (nil: none).
	Inspect(b []byte) (pass int, reply []byte, err error)
}

// inspection is the read side of a Conn that has an Inspector.
type inspection struct {
	inspector Inspector
	*refusal  // set once the inspector has refused the stream (few connections ever are: not held by the others)
}

// refusal is the Inspector's verdict on a stream it refused.
type refusal struct {
	reply  []byte // sent once the bytes before the offending frame have been read
	err    error
	closed bool // the reply is queued and the connection closing
}

// refused returns the Inspector's error, nil while it has refused nothing.
func (in *inspection) refused() error {
	if in.refusal == nil {
		return nil
	}
	return in.refusal.err
}

// Inspect makes i see every byte read from c from now on (before the first
// Read; nil: none). When i refuses the stream, Read passes the bytes before
// the offending frame, then queues i's reply, closes the connection once the
// reply is flushed, and returns i's error from then on: by then the reader
// has handled every frame before the offending one and queued its answers,
// which go out before the reply.
func (c *Conn) Inspect(i Inspector) { c.in.inspector = i }

// Read reads from the connection, through the Inspector if there is one.
func (c *Conn) Read(p []byte) (int, error) {
	if c.in.inspector == nil {
		return c.Conn.Read(p)
	}
	if c.in.refused() != nil {
		return 0, c.refuse()
	}
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	pass, ierr := c.inspect(p[:n])
	if ierr == nil {
		return n, err
	}
	if pass > 0 {
		return pass, nil // the error comes with the next Read, once these bytes are handled
	}
	return 0, c.refuse()
}

// Inspected runs the Inspector (if any) over b, bytes the caller read from
// the connection itself: it returns how many of them to handle and, if the
// Inspector refused the stream, the error with which to end the connection
// once they are handled (Refuse then sends the reply and closes).
func (c *Conn) Inspected(b []byte) (pass int, err error) {
	if c.in.inspector == nil {
		return len(b), nil
	}
	if err := c.in.refused(); err != nil {
		return 0, err
	}
	return c.inspect(b)
}

// Refuse sends the Inspector's reply (once) and closes the connection after
// it, for a caller of Inspected; it returns the Inspector's error.
func (c *Conn) Refuse() error { return c.refuse() }

func (c *Conn) inspect(b []byte) (int, error) {
	pass, reply, ierr := c.in.inspector.Inspect(b)
	if ierr == nil {
		return len(b), nil
	}
	c.in.refusal = &refusal{reply: reply, err: ierr}
	c.stats.ProtocolErrors.Add(1)
	c.log.Info("closing a connection for a protocol error", "remote", c.RemoteAddr().String(), "error", ierr)
	return pass, ierr
}

// refuse sends the Inspector's reply (once) and closes the connection after
// it; it returns the Inspector's error.
func (c *Conn) refuse() error {
	if !c.in.closed {
		c.in.closed = true
		if c.in.reply != nil {
			_, _ = c.Write(c.in.reply) // never dropped; fails only if the connection is gone already
		}
		_ = c.Close()
	}
	return c.in.err
}
