package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/eclipse/paho.golang/paho"
)

// conn is one connection of the worker to the broker, over paho.golang.
type conn struct {
	client         *paho.Client
	sess           *answerSession
	gen            uint64 // the session's number for this connection
	sessionPresent bool
	msgs           chan *paho.Publish // received, waiting for a processing goroutine
	quit           chan struct{}      // closed when the connection ends (or is being closed)
	quitOnce       sync.Once
	mu             sync.Mutex
	lost           error // why the connection ended
}

type dialOptions struct {
	addr, clientID     string
	username, password string
	receiveMax         uint16
	sessionExpiry      uint32 // seconds; 0: the session ends with the connection
	filter             string // $share/<group>/<filter>
	qos                byte
	keyFilters         []string
	buffer             int // messages received ahead of the processing goroutines
}

// dial connects (a clean start unless the session outlives connections) and
// subscribes; it returns the granted QoS.
func dial(ctx context.Context, sess *answerSession, o dialOptions) (*conn, byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", o.addr)
	if err != nil {
		return nil, 0, err
	}
	c := &conn{sess: sess, msgs: make(chan *paho.Publish, o.buffer), quit: make(chan struct{})}
	c.client = paho.NewClient(paho.ClientConfig{
		ClientID: o.clientID,
		Conn:     nc,
		Session:  sess,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(r paho.PublishReceived) (bool, error) {
			select {
			case c.msgs <- r.Packet: // answered later (answerSession)
			case <-c.quit: // unanswered: the broker delivers it again
			}
			return true, nil
		}},
		OnClientError:      func(err error) { c.end(err) },
		OnServerDisconnect: func(d *paho.Disconnect) { c.end(fmt.Errorf("the broker disconnected us: reason 0x%02x", d.ReasonCode)) },
	})
	cp := &paho.Connect{
		ClientID: o.clientID, KeepAlive: 30, CleanStart: o.sessionExpiry == 0,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &o.sessionExpiry, ReceiveMaximum: &o.receiveMax},
	}
	if o.username != "" {
		cp.Username, cp.UsernameFlag = o.username, true
		cp.Password, cp.PasswordFlag = []byte(o.password), true
	}
	ca, err := c.client.Connect(ctx, cp)
	if err != nil {
		_ = nc.Close()
		return nil, 0, err
	}
	c.gen, c.sessionPresent = sess.connection(), ca.SessionPresent
	sub := &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: o.filter, QoS: o.qos}}}
	if len(o.keyFilters) > 0 { // Keyline's key filters: SUBSCRIBE user properties "key-filter"
		sub.Properties = &paho.SubscribeProperties{}
		for _, f := range o.keyFilters {
			sub.Properties.User.Add("key-filter", f)
		}
	}
	sa, err := c.client.Subscribe(ctx, sub)
	if err == nil && sa.Reasons[0] >= 0x80 {
		err = fmt.Errorf("subscribe %s refused: reason code 0x%02x", o.filter, sa.Reasons[0])
	}
	if err != nil {
		c.close()
		return nil, 0, err
	}
	return c, sa.Reasons[0], nil
}

// answer acknowledges m (reason 0) or refuses it (>= 0x80).
func (c *conn) answer(m *paho.Publish, reason byte) error {
	if m.QoS == 0 {
		return nil
	}
	return c.sess.answer(c.gen, m.PacketID, reason)
}

// end records why the connection ended and stops taking messages.
func (c *conn) end(err error) {
	c.mu.Lock()
	if c.lost == nil {
		c.lost = err
	}
	c.mu.Unlock()
	c.quitOnce.Do(func() { close(c.quit) })
}

// err says why the connection ended.
func (c *conn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost == nil {
		return errors.New("connection closed")
	}
	return c.lost
}

// close disconnects and waits for paho's goroutines.
func (c *conn) close() {
	c.end(errors.New("closed"))
	_ = c.client.Disconnect(&paho.Disconnect{ReasonCode: 0})
	<-c.client.Done()
}
