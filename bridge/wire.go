package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// conn is one connection to the remote broker: the socket, a writer
// goroutine that drains everything queued with one Write, and a reader
// goroutine that hands each packet to the bridge. It knows MQTT framing and
// the CONNECT/CONNACK exchange, nothing of rules or groups.
type conn struct {
	nc      net.Conn
	version byte // mqttwire.Version311 or Version5 (also for a 0x84 CONNECT)
	addr    string
	ack     connack
	private bool // the CONNECT carried mosquitto's bridge mark
	limit   int  // the largest packet taken from the remote (announced to MQTT 5 ones)

	wmu struct {
		sync.Mutex
		buf []byte
		// closing refuses new frames: a DISCONNECT is queued, and the
		// writer closes the connection once it has written it.
		closing bool
		reason  error
	}
	wsig chan struct{} // capacity 1: "buf is not empty"

	lastRecv atomic.Int64 // unix nanoseconds of the last packet read
	lastSend atomic.Int64 // unix nanoseconds of the last write

	done      chan struct{} // closed by close
	closeOnce sync.Once
	err       error // why the connection ended; set before done closes
	wg        sync.WaitGroup
}

// connack is what the remote's CONNACK said, with MQTT 5's defaults.
type connack struct {
	sessionPresent bool
	receiveMax     int
	maxQoS         byte
	maxPacket      uint32 // 0: no limit
	keepAlive      time.Duration
	retain         bool
}

// maxQueued bounds the bytes waiting to be written: the in-flight window
// bounds what the bridge writes, so a queue past this means a remote that
// stopped reading.
const maxQueued = 64 << 20

// maxFrame bounds a packet read from the remote when the broker's
// max-packet-size does not (it is what MQTT 5 remotes are told in CONNECT).
const maxFrame = 1 << 20

// errRefused marks a CONNACK that refused the connection.
var errRefused = errors.New("bridge: the remote refused the connection")

// dial connects to the first of cfg's addresses that answers, and does the
// CONNECT/CONNACK exchange, with try_private's mark when private is set; a
// remote that refuses the mark is asked again without it (conn.private
// says which).
func dial(ctx context.Context, cfg *Config, maxPacket uint32, private bool) (*conn, error) {
	var errs []error
	for _, addr := range cfg.Addresses {
		c, err := dialOne(ctx, cfg, addr, private, maxPacket)
		if err != nil && c == nil && errors.Is(err, errPrivateRefused) {
			c, err = dialOne(ctx, cfg, addr, false, maxPacket)
		}
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

var errPrivateRefused = errors.New("bridge: the remote refused the bridge mark (try_private)")

func dialOne(ctx context.Context, cfg *Config, addr string, private bool, maxPacket uint32) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	d := net.Dialer{}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	_ = nc.SetDeadline(deadline)
	if cfg.TLS != nil {
		tc := cfg.TLS.Clone()
		if tc.ServerName == "" && !tc.InsecureSkipVerify {
			host, _, _ := net.SplitHostPort(addr)
			tc.ServerName = host
		}
		t := tls.Client(nc, tc)
		if err := t.HandshakeContext(ctx); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("tls: %w", err)
		}
		nc = t
	}
	c := &conn{nc: nc, version: cfg.Protocol, addr: addr, private: private, limit: int(maxPacket), wsig: make(chan struct{}, 1), done: make(chan struct{})}
	cp := mqttwire.Connect{
		Version: cfg.Protocol, ClientID: cfg.ClientID, CleanStart: cfg.CleanStart,
		KeepAlive: uint16(cfg.KeepAlive / time.Second), Username: cfg.Username, Password: cfg.Password,
	}
	if private {
		cp.Version |= 0x80
	}
	if cfg.Protocol == MQTT5 {
		cp.Props.SessionExpiry = uint32(cfg.SessionExpiry / time.Second)
		cp.Props.ReceiveMaximum = uint16(cfg.InboundMax)
		cp.Props.MaximumPacketSize = maxPacket
	}
	if _, err := nc.Write(mqttwire.AppendConnect(nil, &cp)); err != nil {
		_ = nc.Close()
		return nil, err
	}
	r := mqttwire.NewReader(nc, 4096)
	r.Limit = c.limit
	p, err := r.Next()
	if err != nil {
		_ = nc.Close()
		if private && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) {
			return nil, errPrivateRefused // mochi, for one, closes at an unknown protocol level
		}
		return nil, fmt.Errorf("reading CONNACK: %w", err)
	}
	ca, err := mqttwire.DecodeConnack(cfg.Protocol, p)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	if ca.ReasonCode != 0 {
		_ = nc.Close()
		if private {
			return nil, errPrivateRefused // 0x01 from mosquitto; others answer with what they have
		}
		return nil, fmt.Errorf("%w: CONNACK %s", errRefused, connackReason(cfg.Protocol, ca.ReasonCode))
	}
	c.ack = connack{sessionPresent: ca.SessionPresent, receiveMax: 65535, maxQoS: 2, keepAlive: cfg.KeepAlive, retain: true}
	if cfg.Protocol == MQTT5 {
		props, err := ca.Props.Parse()
		if err != nil {
			_ = nc.Close()
			return nil, err
		}
		if props.ReceiveMaximum > 0 {
			c.ack.receiveMax = int(props.ReceiveMaximum)
		}
		if props.HasMaximumQoS {
			c.ack.maxQoS = props.MaximumQoS
		}
		c.ack.maxPacket = props.MaximumPacketSize
		if props.ServerKeepAlive > 0 {
			c.ack.keepAlive = time.Duration(props.ServerKeepAlive) * time.Second
		}
		c.ack.retain = retainAvailable(ca.Props)
	}
	_ = nc.SetDeadline(time.Time{})
	now := time.Now().UnixNano()
	c.lastRecv.Store(now)
	c.lastSend.Store(now)
	return c, nil
}

// retainAvailable reads CONNACK's Retain Available (absent: available).
func retainAvailable(raw mqttwire.RawProperties) bool {
	for len(raw) > 0 {
		p, rest, err := raw.Next()
		if err != nil {
			return true
		}
		if p.ID == mqttwire.PropRetainAvailable {
			return p.Uint() != 0
		}
		raw = rest
	}
	return true
}

// connackReason names a CONNACK refusal.
func connackReason(version, code byte) string {
	if version == MQTT311 {
		switch code {
		case 1:
			return "0x01 unacceptable protocol version"
		case 2:
			return "0x02 identifier rejected"
		case 3:
			return "0x03 server unavailable"
		case 4:
			return "0x04 bad user name or password"
		case 5:
			return "0x05 not authorized"
		}
	}
	return reasonName(code)
}

// start runs the reader and writer goroutines; handle is called on the
// reader goroutine for every packet (its body is valid only during the call).
func (c *conn) start(handle func(mqttwire.Packet) error) {
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		c.writeLoop()
	}()
	go func() {
		defer c.wg.Done()
		c.readLoop(handle)
	}()
}

func (c *conn) readLoop(handle func(mqttwire.Packet) error) {
	r := mqttwire.NewReader(c.nc, 16<<10)
	r.Limit = c.limit
	for {
		p, err := r.Next()
		if err != nil {
			c.close(fmt.Errorf("read: %w", err))
			return
		}
		c.lastRecv.Store(time.Now().UnixNano())
		if err := handle(p); err != nil {
			c.close(err)
			return
		}
	}
}

// send queues a frame. It never blocks; an error means the connection is
// closing and the frame will not go out.
func (c *conn) send(frame []byte) error {
	c.wmu.Lock()
	if c.wmu.closing {
		c.wmu.Unlock()
		return c.closedErr()
	}
	select {
	case <-c.done:
		c.wmu.Unlock()
		return c.closedErr()
	default:
	}
	first := len(c.wmu.buf) == 0
	c.wmu.buf = append(c.wmu.buf, frame...)
	if len(c.wmu.buf) > maxQueued {
		c.wmu.closing = true
		c.wmu.Unlock()
		c.close(fmt.Errorf("more than %d bytes wait to be written: the remote does not read", maxQueued))
		return c.closedErr()
	}
	c.wmu.Unlock()
	if first {
		select {
		case c.wsig <- struct{}{}:
		default:
		}
	}
	return nil
}

func (c *conn) closedErr() error {
	select {
	case <-c.done:
		return c.err
	default:
		return errors.New("bridge: connection closing")
	}
}

func (c *conn) writeLoop() {
	var spare []byte
	for {
		select {
		case <-c.done:
			return
		case <-c.wsig:
		}
		c.wmu.Lock()
		buf := c.wmu.buf
		c.wmu.buf = spare[:0]
		closing, reason := c.wmu.closing, c.wmu.reason
		c.wmu.Unlock()
		if len(buf) > 0 {
			_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if _, err := c.nc.Write(buf); err != nil {
				c.close(fmt.Errorf("write: %w", err))
				return
			}
			c.lastSend.Store(time.Now().UnixNano())
		}
		if closing {
			c.close(reason) // the DISCONNECT was the last frame
			return
		}
		if cap(buf) <= 1<<20 {
			spare = buf // reuse unless a burst made it large
		} else {
			spare = nil
		}
	}
}

// writeTimeout bounds one write: a remote that takes no bytes for this long is gone.
const writeTimeout = 30 * time.Second

// close ends the connection with err (the first reason wins).
func (c *conn) close(err error) {
	c.closeOnce.Do(func() {
		c.err = err
		close(c.done)
		_ = c.nc.Close()
	})
}

// disconnect queues a DISCONNECT after what is queued, and closes the
// connection once the writer has written it (at most a second from now).
func (c *conn) disconnect(reason byte, err error) {
	if c.version == MQTT311 {
		reason = 0
	}
	c.wmu.Lock()
	if !c.wmu.closing {
		c.wmu.closing, c.wmu.reason = true, err
		c.wmu.buf = mqttwire.AppendDisconnect(c.wmu.buf, reason)
	}
	c.wmu.Unlock()
	select {
	case c.wsig <- struct{}{}:
	default:
	}
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		c.close(err)
	}
}

// wait waits for both goroutines to end (after close).
func (c *conn) wait() { c.wg.Wait() }

// idle reports how long ago the last packet came from the remote and the
// last bytes went to it.
func (c *conn) idle(now time.Time) (recv, sent time.Duration) {
	return now.Sub(time.Unix(0, c.lastRecv.Load())), now.Sub(time.Unix(0, c.lastSend.Load()))
}
