package broker

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"
)

// httpConns bounds the HTTP listener's connections, in all and per client
// address, so that idle or dawdling connections cannot lock anyone out (256
// idle keep-alive connections once made /healthz hang: the listener waited
// for a free slot that never came). A connection is quiet while it has no
// request in progress: new (no request yet) or idle (between keep-alive
// requests). At a bound, the oldest quiet connection (of that address, at
// the per-address bound) is closed to make room for the new one; only when
// every connection is busy does a new one wait (in all) or get closed (per
// address). Past half of either bound, idle connections are closed after
// quietIdle instead of the server's IdleTimeout.
type httpConns struct {
	max, perAddr int
	quietIdle    time.Duration
	mu           struct {
		sync.Mutex
		conns  map[net.Conn]*httpConn
		byAddr map[string]int
		seq    uint64
		freed  chan struct{} // closed and replaced whenever a connection goes
	}
}

type httpConn struct {
	addr string
	seq  uint64 // accept order: the lowest is the oldest
	// quiet: no request in progress (new or idle); waiting: its request
	// waits for its turn at the token check. Room is made from quiet
	// connections first, then from waiting ones.
	quiet, waiting bool
	idle           *time.Timer // the shortened idle timeout, when armed
}

// quietIdle is the idle timeout of keep-alive connections past half a bound.
const quietIdle = time.Second

func newHTTPConns(max, perAddr int) *httpConns {
	c := &httpConns{max: max, perAddr: perAddr, quietIdle: quietIdle}
	c.mu.conns = map[net.Conn]*httpConn{}
	c.mu.byAddr = map[string]int{}
	c.mu.freed = make(chan struct{})
	return c
}

// listener wraps ln so that Accept applies the bounds.
func (c *httpConns) listener(ln net.Listener) net.Listener {
	return &boundedListener{Listener: ln, c: c}
}

type boundedListener struct {
	net.Listener
	c      *httpConns
	once   sync.Once
	closed chan struct{}
}

// Accept accepts the next connection and makes room for it.
func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		switch l.c.admit(conn, l.done()) {
		case admitted:
			return conn, nil
		case closing:
			_ = conn.Close()
			return nil, net.ErrClosed
		}
		_ = conn.Close() // its address holds its share of busy connections
	}
}

func (l *boundedListener) done() chan struct{} {
	l.once.Do(func() { l.closed = make(chan struct{}) })
	return l.closed
}

// Close closes the listener and ends an Accept waiting for room.
func (l *boundedListener) Close() error {
	done := l.done()
	select {
	case <-done:
	default:
		close(done)
	}
	return l.Listener.Close()
}

type admission int

const (
	admitted admission = iota
	refused            // the address holds its share of busy connections
	closing            // the listener closed while the connection waited
)

// admit registers conn, closing a quiet connection to make room; it waits
// while every connection is busy (until closed is).
func (c *httpConns) admit(conn net.Conn, closed <-chan struct{}) admission {
	addr := remoteHost(conn.RemoteAddr())
	c.mu.Lock()
	for {
		if c.perAddr > 0 && c.mu.byAddr[addr] >= c.perAddr && !c.evictLocked(addr) {
			c.mu.Unlock()
			return refused
		}
		if c.max <= 0 || len(c.mu.conns) < c.max || c.evictLocked("") {
			break
		}
		freed := c.mu.freed
		c.mu.Unlock()
		select { // every connection is busy: wait for one to end
		case <-freed:
		case <-closed:
			return closing
		}
		c.mu.Lock()
	}
	c.mu.seq++
	c.mu.conns[conn] = &httpConn{addr: addr, seq: c.mu.seq, quiet: true}
	c.mu.byAddr[addr]++
	c.mu.Unlock()
	return admitted
}

// evictLocked closes the oldest quiet connection (of addr; "": of anyone),
// else the oldest one waiting for a token check, and forgets it; false when
// there is neither.
func (c *httpConns) evictLocked(addr string) bool {
	var oldest net.Conn
	var info *httpConn
	rank := func(in *httpConn) int {
		switch {
		case in.quiet:
			return 2
		case in.waiting:
			return 1
		}
		return 0
	}
	for conn, in := range c.mu.conns {
		if r := rank(in); r > 0 && (addr == "" || in.addr == addr) &&
			(info == nil || r > rank(info) || (r == rank(info) && in.seq < info.seq)) {
			oldest, info = conn, in
		}
	}
	if oldest == nil {
		return false
	}
	c.forgetLocked(oldest, info)
	_ = oldest.Close() // net/http sees it end and reports StateClosed, for a connection already forgotten
	return true
}

func (c *httpConns) forgetLocked(conn net.Conn, in *httpConn) {
	if in.idle != nil {
		in.idle.Stop()
	}
	delete(c.mu.conns, conn)
	if c.mu.byAddr[in.addr]--; c.mu.byAddr[in.addr] <= 0 {
		delete(c.mu.byAddr, in.addr)
	}
	close(c.mu.freed)
	c.mu.freed = make(chan struct{})
}

// state is the server's ConnState hook.
func (c *httpConns) state(conn net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in := c.mu.conns[conn]
	if in == nil {
		return // evicted already
	}
	switch s {
	case http.StateActive:
		in.quiet = false
		if in.idle != nil {
			in.idle.Stop()
			in.idle = nil
		}
	case http.StateIdle:
		in.quiet = true
		if 2*len(c.mu.conns) > c.max || (c.perAddr > 0 && 2*c.mu.byAddr[in.addr] > c.perAddr) {
			in.idle = time.AfterFunc(c.quietIdle, func() { c.closeIfIdle(conn) })
		}
	case http.StateHijacked, http.StateClosed:
		c.forgetLocked(conn, in)
	}
}

// count returns how many connections are registered.
func (c *httpConns) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.mu.conns)
}

// connKey is the request context's key of its connection (withConn).
type connKey struct{}

// withConn is the server's ConnContext: requests know their connection.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// waitingFor marks r's connection as waiting for a token check, which may
// be closed to make room (after the quiet ones); the returned function ends
// the wait. Its request's context ends when the connection is closed.
func (c *httpConns) waitingFor(r *http.Request) func() {
	conn, _ := r.Context().Value(connKey{}).(net.Conn)
	set := func(on bool) {
		c.mu.Lock()
		if in := c.mu.conns[conn]; in != nil {
			in.waiting = on
		}
		c.mu.Unlock()
	}
	set(true)
	return func() { set(false) }
}

// closeIfIdle closes conn if it is still between requests.
func (c *httpConns) closeIfIdle(conn net.Conn) {
	c.mu.Lock()
	in := c.mu.conns[conn]
	idle := in != nil && in.quiet && in.idle != nil
	if idle {
		c.forgetLocked(conn, in)
	}
	c.mu.Unlock()
	if idle {
		_ = conn.Close()
	}
}

// remoteHost is the IP of a connection's remote address.
func remoteHost(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
