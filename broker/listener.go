package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/netpoll"
)

// listener is an MQTT listener that binds its address when it is created, so
// that a port in use is an error at startup rather than a log line later.
// It implements mochi's listeners.Listener.
type listener struct {
	id    string
	proto string // "tcp", "tls", "ws" or "wss"
	ln    net.Listener
	web   *http.Server // set for WebSocket listeners
	log   *slog.Logger
	// closing is closed by Close: it ends an accept backoff.
	closing chan struct{}
	// poller, when set (Linux), serves plain TCP connections from readiness
	// events instead of a goroutine each (eventconn.go); server is the mochi
	// server they are fed to. Set before Serve.
	poller *netpoll.Poller
	server *mqtt.Server
	// deadlines wakes event-served connections whose deadline passed
	// (deadlines.go); set with poller.
	deadlines *deadlines
	// afterPollerAdd, when set (tests), runs between a connection's
	// registration with poller and serveEvents recording it, a window in
	// which its whole life can pass under load.
	afterPollerAdd atomic.Pointer[func()]

	establish listeners.EstablishFn
	// queue wraps each accepted connection in its outbound queue; set before Serve.
	queue func(c net.Conn) *connq.Conn
	// closeClients, when set, disconnects the listener's clients on Close
	// in place of mochi's sweep: the broker's sends them away with its
	// server reference (Broker.sendAway). Set before Serve.
	closeClients listeners.CloseFn
	mu           struct {
		sync.Mutex
		closed bool
		open   map[net.Conn]func() // connections being served, and how Close closes each
	}
	conns sync.WaitGroup // connection handlers this listener started; Add only under mu while open
	// stopped is set when the listener stopped accepting for good without
	// being closed (an accept error that is not temporary): the broker is
	// then not ready (/readyz 503).
	stopped atomic.Pointer[error]
}

// Stopped returns why the listener stopped accepting connections without
// being closed, or nil while it accepts (or was closed).
func (l *listener) Stopped() error {
	if p := l.stopped.Load(); p != nil {
		return *p
	}
	return nil
}

func (l *listener) stop(err error) {
	err = fmt.Errorf("%s listener on %s stopped accepting: %w", l.id, l.Address(), err)
	l.stopped.Store(&err)
	l.log.Error("listener stopped accepting connections; the broker is no longer ready", "error", err)
}

// track registers a connection about to be served, with the function that
// closes it when the listener closes (nil: close it at once); false once
// the listener is closed.
func (l *listener) track(c net.Conn, closer func()) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return false
	}
	if l.mu.open == nil {
		l.mu.open = map[net.Conn]func(){}
	}
	if closer == nil {
		// Its handler closes it through its queue (bounded), once the
		// read it waits in ends.
		closer = func() { _ = c.SetReadDeadline(time.Now()) }
	}
	l.mu.open[c] = closer
	l.conns.Add(1)
	return true
}

func (l *listener) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.mu.open, c)
	l.mu.Unlock()
	l.conns.Done()
}

func (l *listener) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.closed
}

func listen(id, proto, addr string, tlsConf *tls.Config, allowedOrigins []string) (*listener, error) {
	var lc net.ListenConfig
	if proto == "tcp" {
		// No TCP keep-alive by default: MQTT's keep-alive finds dead clients,
		// and Go's default costs three setsockopt calls per accepted
		// connection. A client that asks for no MQTT keep-alive gets TCP's
		// (eventConn.deadline).
		lc.KeepAlive = -1
	}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
	l := &listener{id: id, proto: proto, ln: ln, closing: make(chan struct{})}
	if proto == "ws" || proto == "wss" {
		up := &websocket.Upgrader{
			Subprotocols: []string{"mqtt"},
			// A web page may not open MQTT connections from the operator's
			// browser to a broker on another host (cross-site WebSocket).
			CheckOrigin: func(r *http.Request) bool { return originAllowed(r, allowedOrigins) },
			// An idle WebSocket connection keeps its read buffer (gorilla's
			// default 4 KiB, the most a frame header read takes at once) but
			// borrows a write buffer only while it writes.
			ReadBufferSize:  1 << 10,
			WriteBufferSize: 4 << 10,
			WriteBufferPool: new(sync.Pool),
		}
		l.web = &http.Server{
			Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { l.upgrade(up, w, r) }),
			ReadHeaderTimeout: 10 * time.Second,
		}
	}
	return l, nil
}

func (l *listener) ID() string       { return l.id }
func (l *listener) Address() string  { return l.ln.Addr().String() }
func (l *listener) Protocol() string { return l.proto }

// Init sets the logger; the address is already bound.
func (l *listener) Init(log *slog.Logger) error {
	l.log = log.With("listener", l.id)
	if l.web != nil {
		// Failed handshakes (a refused client certificate, logged with its
		// reason by tlsconf.go) and the like, at debug, not on stderr.
		l.web.ErrorLog = slog.NewLogLogger(l.log.Handler(), slog.LevelDebug)
	}
	return nil
}

// Serve accepts connections until Close.
func (l *listener) Serve(establish listeners.EstablishFn) {
	l.establish = establish
	if l.web != nil {
		// http.Server retries temporary accept errors itself, with backoff.
		if err := l.web.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !l.isClosed() {
			l.stop(err)
		}
		return
	}
	var backoff acceptBackoff
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if l.isClosed() {
				return
			}
			if !temporaryAcceptError(err) {
				l.stop(err)
				return
			}
			if !backoff.wait(l, err) {
				return // closed while waiting
			}
			continue
		}
		backoff.reset(l)
		if tc, ok := conn.(*net.TCPConn); ok && l.poller != nil {
			if !l.serveEvents(tc) {
				return // closed
			}
			continue
		}
		if !l.track(conn, nil) {
			_ = conn.Close()
			return
		}
		go func() {
			defer l.untrack(conn)
			l.handle(conn)
		}()
	}
}

// temporaryAcceptError reports whether an Accept error may go away by
// itself: the process or the system is out of file descriptors or buffers
// for a moment (EMFILE, ENFILE, ENOBUFS, ENOMEM), or a connection was
// aborted before it was accepted (ECONNABORTED; Go retries those itself, but
// a wrapped listener may not). net/http retries the same way.
func temporaryAcceptError(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// acceptBackoff spaces out accepts after temporary errors: 5 ms, doubling
// to 1 s, as net/http does; one log line per run of errors.
type acceptBackoff struct {
	delay  time.Duration
	errors int
}

const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// wait sleeps for the next backoff delay; false if the listener was closed meanwhile.
func (b *acceptBackoff) wait(l *listener, err error) bool {
	if b.delay == 0 {
		b.delay = acceptBackoffMin
		l.log.Warn("accept failed, retrying with backoff (out of file descriptors? see max-clients and ulimit -n)", "error", err)
	} else {
		b.delay = min(2*b.delay, acceptBackoffMax)
	}
	b.errors++
	// A deliberate wall-clock wait: the condition (free descriptors) gives no
	// event to wait on. Close ends it.
	t := time.NewTimer(b.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.closing:
		return false
	}
}

// reset ends a run of errors once an accept succeeds.
func (b *acceptBackoff) reset(l *listener) {
	if b.errors > 0 {
		l.log.Info("accepting connections again", "failed_accepts", b.errors)
		b.delay, b.errors = 0, 0
	}
}

// connectTimeout bounds the wait for a new connection's CONNECT; mochi sets
// the keepalive deadline once it has one.
const connectTimeout = 10 * time.Second

func (l *listener) handle(conn net.Conn) {
	_ = conn.SetReadDeadline(time.Now().Add(connectTimeout))
	q := l.queue(conn)
	q.AwaitConnack() // a session is attached as its CONNACK is written: its messages go after it
	if err := l.establish(l.id, q); err != nil && !errors.Is(err, io.EOF) {
		l.log.Debug("connection ended", "remote", conn.RemoteAddr().String(), "error", err)
	}
	_ = q.Close() // mochi has closed it already unless CONNECT never came
	<-q.Done()    // queued frames flushed (bounded by connq.FlushTimeout)
}

func (l *listener) upgrade(up *websocket.Upgrader, w http.ResponseWriter, r *http.Request) {
	c, err := up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered the request with the error
	}
	conn := &wsConn{Conn: c.UnderlyingConn(), ws: c}
	if !l.track(conn, nil) {
		_ = conn.Close()
		return
	}
	// Served from a goroutine of its own, so that the HTTP handler returns:
	// the request and the HTTP server's 4 KiB read and write buffers of the
	// hijacked connection are not kept for the connection's life.
	go func() {
		defer l.untrack(conn)
		defer conn.Close()
		l.handle(conn)
	}()
}

// Close stops accepting, closes this listener's clients and waits for their handlers.
func (l *listener) Close(closeClients listeners.CloseFn) {
	l.mu.Lock()
	already := l.mu.closed
	l.mu.closed = true
	l.mu.Unlock()
	if already {
		return
	}
	close(l.closing)
	if l.closeClients != nil {
		closeClients = l.closeClients
	}
	if l.web != nil {
		_ = l.web.Close() // closes the listener; hijacked websocket connections are ended below
	} else {
		_ = l.ln.Close()
	}
	// Connections that never became clients (no CONNECT yet) are not
	// mochi's to end: their closers end them (for a connection served by
	// a goroutine, a past read deadline: its handler then closes it through
	// its queue, which first flushes what is queued, the DISCONNECT a client
	// was just sent, for at most connq.FlushTimeout). A CONNECT being
	// handled as the sweep runs makes a client the sweep did not see, and
	// mochi moves its read deadline on: the sweep is repeated until every
	// connection's handler has ended.
	done := make(chan struct{})
	go func() {
		l.conns.Wait()
		close(done)
	}()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		closeClients(l.id)
		l.mu.Lock()
		closers := make([]func(), 0, len(l.mu.open))
		for _, closeConn := range l.mu.open {
			closers = append(closers, closeConn)
		}
		l.mu.Unlock()
		for _, closeConn := range closers { // outside the lock: untrack takes it
			closeConn()
		}
		select {
		case <-done:
			return
		case <-t.C:
		}
	}
}

// wsConn carries MQTT over binary WebSocket messages as a net.Conn.
type wsConn struct {
	net.Conn
	ws *websocket.Conn
	r  io.Reader  // the message being read
	wm sync.Mutex // one writer at a time
}

func (c *wsConn) Read(p []byte) (int, error) {
	for {
		if c.r == nil {
			op, r, err := c.ws.NextReader()
			if err != nil {
				return 0, err
			}
			if op != websocket.BinaryMessage {
				continue // MQTT over WebSocket is binary; ignore anything else
			}
			c.r = r
		}
		n, err := c.r.Read(p)
		if errors.Is(err, io.EOF) {
			c.r = nil
			if n == 0 {
				continue
			}
			err = nil
		}
		return n, err
	}
}

func (c *wsConn) Write(p []byte) (int, error) {
	c.wm.Lock()
	defer c.wm.Unlock()
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *wsConn) Close() error { return c.ws.Close() }
