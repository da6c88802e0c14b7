package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// dialTransport opens a connection to addr over transport: "tcp", "tls"
// (any certificate: the broker under test is ours) or "ws" (MQTT over
// binary WebSocket messages, path /).
func dialTransport(ctx context.Context, transport, addr string, d *net.Dialer) (net.Conn, error) {
	switch transport {
	case "", "tcp":
		return d.DialContext(ctx, "tcp", addr)
	case "tls":
		td := tls.Dialer{NetDialer: d, Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // the benchmark's own broker, on loopback
		return td.DialContext(ctx, "tcp", addr)
	case "ws":
		wd := websocket.Dialer{NetDialContext: d.DialContext, Subprotocols: []string{"mqtt"}, HandshakeTimeout: d.Timeout}
		ws, _, err := wd.DialContext(ctx, "ws://"+addr+"/", nil)
		if err != nil {
			return nil, err
		}
		return &wsConn{Conn: ws.UnderlyingConn(), ws: ws}, nil
	}
	return nil, fmt.Errorf("unknown transport %q (tcp, tls, ws)", transport)
}

// wsConn carries MQTT over binary WebSocket messages as a net.Conn.
type wsConn struct {
	net.Conn
	ws  *websocket.Conn
	rmu sync.Mutex
	buf []byte
	wmu sync.Mutex
}

func (c *wsConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.buf) == 0 {
		_, data, err := c.ws.ReadMessage()
		if err != nil {
			return 0, err
		}
		c.buf = data
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *wsConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.ws.WriteMessage(websocket.BinaryMessage, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *wsConn) Close() error { return c.ws.Close() }

func (c *wsConn) SetDeadline(t time.Time) error {
	_ = c.ws.SetReadDeadline(t)
	return c.ws.SetWriteDeadline(t)
}
