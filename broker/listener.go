package broker

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/keyline-mq/keyline/internal/connq"
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

	establish listeners.EstablishFn
	// queue wraps each accepted connection in its outbound queue; set before Serve.
	queue func(c net.Conn) *connq.Conn
	// closeClients disconnects the listener's clients on Close, in place of
	// mochi's sweep (closeListenerClients), whose Clients.GetByListener takes
	// the clients' read lock twice: a client leaving in between queues its
	// write lock there and shutdown hangs for good (mochi-mqtt/server#488,
	// open in v2.7.9). Set before Serve.
	closeClients listeners.CloseFn
	mu           struct {
		sync.Mutex
		closed bool
		open   map[net.Conn]struct{} // connections being served, closed on Close
	}
	conns sync.WaitGroup // connection handlers this listener started; Add only under mu while open
}

// track registers a connection about to be served; false once the listener is closed.
func (l *listener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return false
	}
	if l.mu.open == nil {
		l.mu.open = map[net.Conn]struct{}{}
	}
	l.mu.open[c] = struct{}{}
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
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
	l := &listener{id: id, proto: proto, ln: ln}
	if proto == "ws" || proto == "wss" {
		up := &websocket.Upgrader{
			Subprotocols: []string{"mqtt"},
			// A web page may not open MQTT connections from the operator's
			// browser to a broker on another host (cross-site WebSocket).
			CheckOrigin: func(r *http.Request) bool { return originAllowed(r, allowedOrigins) },
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
		if err := l.web.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !l.isClosed() {
			l.log.Error("websocket listener stopped", "error", err)
		}
		return
	}
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if !l.isClosed() {
				l.log.Error("listener stopped accepting", "error", err)
			}
			return
		}
		if !l.track(conn) {
			_ = conn.Close()
			return
		}
		go func() {
			defer l.untrack(conn)
			l.handle(conn)
		}()
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
	if !l.track(conn) {
		_ = conn.Close()
		return
	}
	defer l.untrack(conn)
	defer conn.Close()
	l.handle(conn)
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
	defer func() {
		// Connections that never became clients (no CONNECT yet) are not
		// mochi's to close: close them here so the wait below ends.
		l.mu.Lock()
		for c := range l.mu.open {
			_ = c.SetDeadline(time.Now()) // a TLS close_notify must not wait on a peer that does not read
			_ = c.Close()
		}
		l.mu.Unlock()
		l.conns.Wait()
	}()
	if l.web != nil {
		_ = l.web.Close() // closes the listener; hijacked websocket connections are closed below
	} else {
		_ = l.ln.Close()
	}
	if l.closeClients != nil {
		closeClients = l.closeClients
	}
	closeClients(l.id)
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
