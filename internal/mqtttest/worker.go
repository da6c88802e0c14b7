package mqtttest

// Worker is a small raw MQTT 5 client for Key-Shared tests and examples. Client
// libraries decide for their user when and how a message is acknowledged
// (paho.golang v0.23.0 cannot send a PUBACK reason code at all); a keyed
// worker needs to ack, nack with any reason code, hold an ack back, and
// vanish without DISCONNECT. Frames are encoded and decoded by mqttwire
// (worker_codec.go maps the worker's types onto it); worker_conn.go holds
// the plumbing: packet ids, round trips, the reader and the pinger.
//
// One reader goroutine decodes what the broker sends; writes happen under a
// mutex from any goroutine. Disconnect and Vanish wait for the reader (and
// the keep-alive pinger) to exit.

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// Reason codes a worker commonly sends.
const (
	ReasonSuccess              byte = 0x00
	ReasonUnspecifiedError     byte = 0x80 // nack: retry after backoff
	ReasonImplementationError  byte = 0x83 // nack: retry after backoff
	ReasonNotAuthorized        byte = 0x87 // reject: dead-letter at once
	ReasonPayloadFormatInvalid byte = 0x99 // reject: dead-letter at once
)

// KeyProperty is the user property Key-Shared reads the routing key from by
// default (the broker's --key-property), and WorkerMessage.Key reports.
const KeyProperty = "key"

// KeyFilterProperty is the SUBSCRIBE user property carrying a key filter.
const KeyFilterProperty = "key-filter"

var (
	// ErrWorkerClosed is returned by calls on a worker whose connection has ended.
	ErrWorkerClosed = errors.New("mqtttest: worker connection closed")
	// ErrWorkerTimeout is returned when the broker does not answer within WorkerOptions.Timeout.
	ErrWorkerTimeout = errors.New("mqtttest: no answer from the broker in time")
	// ErrMalformed is wrapped by Err's value when the broker sent a frame the
	// worker cannot decode (it is mqttwire's).
	ErrMalformed = mqttwire.ErrMalformed
)

// ConnectError is DialWorker's error for a CONNACK with a failure reason code.
type ConnectError struct {
	ReasonCode byte
	Reason     string // the CONNACK's reason string, if any
}

func (e *ConnectError) Error() string {
	return fmt.Sprintf("mqtttest: connection refused: reason code 0x%02x %s", e.ReasonCode, e.Reason)
}

// DisconnectError is Err's value after the broker sent DISCONNECT.
type DisconnectError struct {
	ReasonCode byte
	Reason     string
}

func (e *DisconnectError) Error() string {
	return fmt.Sprintf("mqtttest: broker disconnected: reason code 0x%02x %s", e.ReasonCode, e.Reason)
}

// UserProperty is an MQTT 5 user property.
type UserProperty = mqttwire.UserProperty

// WorkerOptions are the CONNECT settings of a Worker.
type WorkerOptions struct {
	ReceiveMaximum uint16 // QoS 1/2 messages the broker may have unacknowledged towards us; 0: not sent (65535)
	SessionExpiry  uint32 // seconds the session outlives the connection; 0: ends with it
	CleanStart     bool   // discard any existing session
	KeepAlive      uint16 // seconds; > 0 makes the worker send PINGREQ at half that interval; 0: no keep-alive
	// MaximumPacketSize is the largest packet the worker takes; 0: not sent (no limit).
	MaximumPacketSize uint32
	Username          string // sent when not empty
	Password          string // sent when not empty

	// Timeout bounds the wait for CONNACK, SUBACK, UNSUBACK and a publish's
	// acknowledgement (default Timeout, 10s).
	Timeout time.Duration
	// Buffer is the capacity of Messages (default 1024). The reader waits
	// when it is full, so acks to the worker's own publishes wait too.
	Buffer int
}

// Connack is what the broker answered to CONNECT.
type Connack struct {
	SessionPresent   bool
	ReasonCode       byte
	ReceiveMaximum   uint16 // the broker's; 0 when not sent (65535)
	TopicAliasMax    uint16 // the broker's Topic Alias Maximum; 0 when not sent
	ServerKeepAlive  uint16 // 0 when not sent
	MaximumQoS       byte   // 2 when not sent
	AssignedClientID string
	ReasonString     string
	User             []UserProperty
}

// WorkerMessage is a PUBLISH the worker received.
type WorkerMessage struct {
	Topic    string
	Payload  []byte
	QoS      byte
	PacketID uint16 // 0 for QoS 0
	Dup      bool
	Retain   bool
	// Key is the value of the "key" user property (KeyProperty), "" without one.
	Key  string
	User []UserProperty
	// MessageExpiry is the remaining message expiry interval in seconds, when HasExpiry.
	MessageExpiry   uint32
	HasExpiry       bool
	ContentType     string
	ResponseTopic   string
	CorrelationData []byte
	PayloadFormat   byte
	SubscriptionIDs []int

	answered bool // guarded by Worker.wmu: Ack/Nack sent
}

// Prop returns the value of the first user property named key.
func (m *WorkerMessage) Prop(key string) (string, bool) {
	for _, p := range m.User {
		if p.Key == key {
			return p.Value, true
		}
	}
	return "", false
}

// ack is an acknowledgement (PUBACK, PUBREC, PUBCOMP, SUBACK, UNSUBACK) the
// reader hands to the call waiting for it.
type ack struct {
	typ   byte
	codes []byte // one reason code; one per filter for SUBACK/UNSUBACK
}

// Worker is a connected raw MQTT 5 client. Its methods are safe for
// concurrent use.
type Worker struct {
	ClientID string
	conn     net.Conn
	timeout  time.Duration
	connack  Connack

	msgs chan *WorkerMessage
	quit chan struct{} // closed by Disconnect/Vanish
	// leaving is set before our DISCONNECT goes out: the broker's close that
	// follows is the end we asked for, not an error.
	leaving atomic.Bool
	done    chan struct{} // closed when the reader has exited
	wg      sync.WaitGroup
	once    sync.Once

	wmu sync.Mutex // serialises writes (one frame per Write)

	mu struct {
		sync.Mutex
		nextID  uint16              // last packet id handed out (counting down)
		pending map[uint16]chan ack // our packet ids awaiting an answer
		err     error               // why the reader stopped
	}
}

// DialWorker connects to addr over TCP as clientID with MQTT 5 and waits for
// the CONNACK. A CONNACK with a failure reason code is a *ConnectError.
func DialWorker(addr, clientID string, opts WorkerOptions) (*Worker, error) {
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = Timeout
	}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("mqtttest: dial %s: %w", addr, err)
	}
	return ConnectWorker(conn, clientID, opts)
}

// ConnectWorker is DialWorker over an open connection (TLS, WebSocket, a
// test's net.Pipe). The worker owns conn from here on, failure included.
func ConnectWorker(conn net.Conn, clientID string, opts WorkerOptions) (*Worker, error) {
	w := &Worker{
		ClientID: clientID,
		conn:     conn,
		timeout:  opts.Timeout,
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if w.timeout <= 0 {
		w.timeout = Timeout
	}
	buf := opts.Buffer
	if buf <= 0 {
		buf = 1024
	}
	w.msgs = make(chan *WorkerMessage, buf)
	w.mu.pending = map[uint16]chan ack{}

	_ = conn.SetDeadline(time.Now().Add(w.timeout))
	if _, err := conn.Write(encodeConnect(clientID, opts)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("mqtttest: send CONNECT: %w", err)
	}
	r := mqttwire.NewReader(conn, 0)
	p, err := r.Next()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("mqtttest: read CONNACK: %w", err)
	}
	if w.connack, err = decodeConnack(p); err != nil {
		conn.Close()
		return nil, err
	}
	if w.connack.ReasonCode >= 0x80 {
		conn.Close()
		return nil, &ConnectError{ReasonCode: w.connack.ReasonCode, Reason: w.connack.ReasonString}
	}
	_ = conn.SetDeadline(time.Time{})

	keepAlive := opts.KeepAlive
	if w.connack.ServerKeepAlive > 0 {
		keepAlive = w.connack.ServerKeepAlive
	}
	w.wg.Add(1)
	go w.readLoop(r)
	if keepAlive > 0 {
		w.wg.Add(1)
		go w.pingLoop(time.Duration(keepAlive) * time.Second / 2)
	}
	return w, nil
}

// Connack returns the broker's CONNACK.
func (w *Worker) Connack() Connack { return w.connack }

// Messages returns the channel of received PUBLISH packets. It is closed when
// the connection ends.
func (w *Worker) Messages() <-chan *WorkerMessage { return w.msgs }

// Done is closed when the connection has ended (and the reader has exited).
func (w *Worker) Done() <-chan struct{} { return w.done }

// Err returns why the connection ended: nil while it is up or after
// Disconnect/Vanish, a *DisconnectError if the broker sent DISCONNECT, else
// the read error.
func (w *Worker) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.err
}

// Next waits up to d for the next message; it returns nil on timeout or when
// the connection has ended.
func (w *Worker) Next(d time.Duration) *WorkerMessage {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case m := <-w.msgs:
		return m
	case <-t.C:
		return nil
	}
}

// Ack acknowledges m as processed: PUBACK (QoS 1) or PUBREC (QoS 2, the
// reader answers the broker's PUBREL with PUBCOMP, which is the Key-Shared
// ack). QoS 0 needs nothing.
func (w *Worker) Ack(m *WorkerMessage) error { return w.answer(m, ReasonSuccess) }

// Nack answers m with reason: PUBACK (QoS 1) or PUBREC (QoS 2) carrying the
// reason code. Key-Shared retries reason codes >= 0x80 after its backoff and
// dead-letters 0x87 and 0x99 at once; a code below 0x80 is sent as given
// (it is a success to the broker).
func (w *Worker) Nack(m *WorkerMessage, reason byte) error { return w.answer(m, reason) }

func (w *Worker) answer(m *WorkerMessage, reason byte) error {
	if m.QoS == 0 {
		return nil
	}
	typ := mqttwire.TypePuback
	if m.QoS == 2 {
		typ = mqttwire.TypePubrec
	}
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if m.answered {
		return fmt.Errorf("mqtttest: packet %d on %s already answered", m.PacketID, m.Topic)
	}
	m.answered = true
	return w.writeLocked(mqttwire.AppendAck(nil, typ, m.PacketID, reason))
}

// Subscribe subscribes to filter with maximum QoS qos, sending each key
// filter as a "key-filter" user property, and returns the SUBACK reason code
// (the granted QoS, or a failure code >= 0x80).
func (w *Worker) Subscribe(filter string, qos byte, keyFilters ...string) (byte, error) {
	id, ch, err := w.reserve()
	if err != nil {
		return 0, err
	}
	a, err := w.roundTrip(id, ch, encodeSubscribe(id, filter, qos, keyFilters))
	if err != nil {
		return 0, err
	}
	if a.typ != mqttwire.TypeSuback || len(a.codes) != 1 {
		return 0, fmt.Errorf("%w: SUBACK for one filter has %d reason codes", ErrMalformed, len(a.codes))
	}
	return a.codes[0], nil
}

// Unsubscribe unsubscribes from filter and returns the UNSUBACK reason code.
func (w *Worker) Unsubscribe(filter string) (byte, error) {
	id, ch, err := w.reserve()
	if err != nil {
		return 0, err
	}
	a, err := w.roundTrip(id, ch, encodeUnsubscribe(id, filter))
	if err != nil {
		return 0, err
	}
	if a.typ != mqttwire.TypeUnsuback || len(a.codes) != 1 {
		return 0, fmt.Errorf("%w: UNSUBACK for one filter has %d reason codes", ErrMalformed, len(a.codes))
	}
	return a.codes[0], nil
}

// Publish publishes payload to topic and waits for the flow to complete:
// QoS 0 returns once written, QoS 1 returns the PUBACK reason code, QoS 2 the
// PUBREC reason code when it is a failure, else the PUBCOMP's.
func (w *Worker) Publish(topic string, payload []byte, qos byte, userProps ...UserProperty) (byte, error) {
	return w.PublishMessage(Outgoing{Topic: topic, Payload: payload, QoS: qos, User: userProps})
}

// Outgoing is a message to publish, with the options Publish leaves out.
type Outgoing struct {
	Topic         string
	Payload       []byte
	QoS           byte
	Retain        bool
	MessageExpiry uint32 // seconds; 0: none
	TopicAlias    uint16 // 0: none
	User          []UserProperty
}

// PublishMessage is Publish with every option.
func (w *Worker) PublishMessage(o Outgoing) (byte, error) {
	if o.QoS > 2 {
		return 0, fmt.Errorf("mqtttest: QoS %d", o.QoS)
	}
	if o.QoS == 0 {
		w.wmu.Lock()
		defer w.wmu.Unlock()
		return 0, w.writeLocked(encodePublish(o, 0))
	}
	id, ch, err := w.reserve()
	if err != nil {
		return 0, err
	}
	a, err := w.roundTrip(id, ch, encodePublish(o, id))
	if err != nil {
		return 0, err
	}
	return a.codes[0], nil
}

// Disconnect sends DISCONNECT (normal), closes the connection and waits for
// the worker's goroutines. Later calls return nil.
func (w *Worker) Disconnect() error {
	var err error
	w.once.Do(func() {
		w.leaving.Store(true)
		w.wmu.Lock()
		err = w.writeLocked(mqttwire.AppendDisconnect(nil, 0))
		w.wmu.Unlock()
		if errors.Is(err, ErrWorkerClosed) {
			err = nil // already gone: nothing to say goodbye to
		}
		w.shut()
	})
	return err
}

// Close is Disconnect without the error, for defer and t.Cleanup.
func (w *Worker) Close() { _ = w.Disconnect() }

// Vanish closes the TCP connection without DISCONNECT, as a crashed worker
// would, and waits for the worker's goroutines. Later calls do nothing.
func (w *Worker) Vanish() {
	w.once.Do(w.shut)
}

func (w *Worker) shut() {
	close(w.quit)
	_ = w.conn.Close()
	w.wg.Wait()
}
