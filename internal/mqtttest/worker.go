package mqtttest

// Worker is a small raw MQTT 5 client for Key-Shared tests and examples. Client
// libraries decide for their user when and how a message is acknowledged
// (paho.golang v0.23.0 cannot send a PUBACK reason code at all); a keyed
// worker needs to ack, nack with any reason code, hold an ack back, and
// vanish without DISCONNECT. Frames are hand-encoded here.
//
// One reader goroutine decodes what the broker sends; writes happen under a
// mutex from any goroutine. Disconnect and Vanish wait for the reader (and
// the keep-alive pinger) to exit.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// MQTT control packet types (high nibble of the first byte).
const (
	typeConnect     = 1
	typeConnack     = 2
	typePublish     = 3
	typePuback      = 4
	typePubrec      = 5
	typePubrel      = 6
	typePubcomp     = 7
	typeSubscribe   = 8
	typeSuback      = 9
	typeUnsubscribe = 10
	typeUnsuback    = 11
	typePingreq     = 12
	typePingresp    = 13
	typeDisconnect  = 14
	typeAuth        = 15
)

// MQTT 5 property identifiers.
const (
	propPayloadFormat     = 0x01
	propMessageExpiry     = 0x02
	propContentType       = 0x03
	propResponseTopic     = 0x08
	propCorrelationData   = 0x09
	propSubscriptionID    = 0x0B
	propSessionExpiry     = 0x11
	propAssignedClientID  = 0x12
	propServerKeepAlive   = 0x13
	propAuthMethod        = 0x15
	propAuthData          = 0x16
	propRequestProblem    = 0x17
	propWillDelay         = 0x18
	propRequestResponse   = 0x19
	propResponseInfo      = 0x1A
	propServerReference   = 0x1C
	propReasonString      = 0x1F
	propReceiveMaximum    = 0x21
	propTopicAliasMaximum = 0x22
	propTopicAlias        = 0x23
	propMaximumQoS        = 0x24
	propRetainAvailable   = 0x25
	propUserProperty      = 0x26
	propMaximumPacketSize = 0x27
	propWildcardAvailable = 0x28
	propSubIDAvailable    = 0x29
	propSharedAvailable   = 0x2A
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
	// ErrMalformed is returned (by Err) when the broker sent a frame the worker cannot decode.
	ErrMalformed = errors.New("mqtttest: malformed packet from the broker")
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
type UserProperty struct {
	Key, Value string
}

// WorkerOptions are the CONNECT settings of a Worker.
type WorkerOptions struct {
	ReceiveMaximum uint16 // QoS 1/2 messages the broker may have unacknowledged towards us; 0: not sent (65535)
	SessionExpiry  uint32 // seconds the session outlives the connection; 0: ends with it
	CleanStart     bool   // discard any existing session
	KeepAlive      uint16 // seconds; > 0 makes the worker send PINGREQ at half that interval; 0: no keep-alive
	Username       string // sent when not empty
	Password       string // sent when not empty

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
	done chan struct{} // closed when the reader has exited
	wg   sync.WaitGroup
	once sync.Once

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
	r := bufio.NewReader(conn)
	typ, _, body, err := readFrame(r)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("mqtttest: read CONNACK: %w", err)
	}
	if typ != typeConnack {
		conn.Close()
		return nil, fmt.Errorf("%w: got packet type %d, want CONNACK", ErrMalformed, typ)
	}
	if w.connack, err = decodeConnack(body); err != nil {
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
	typ := byte(typePuback)
	if m.QoS == 2 {
		typ = typePubrec
	}
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if m.answered {
		return fmt.Errorf("mqtttest: packet %d on %s already answered", m.PacketID, m.Topic)
	}
	m.answered = true
	return w.writeLocked(encodeAck(typ, m.PacketID, reason))
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
	if a.typ != typeSuback || len(a.codes) != 1 {
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
	if a.typ != typeUnsuback || len(a.codes) != 1 {
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
		w.wmu.Lock()
		err = w.writeLocked([]byte{typeDisconnect << 4, 0})
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

// --- plumbing ---

// writeLocked writes one frame; w.wmu is held.
func (w *Worker) writeLocked(frame []byte) error {
	select {
	case <-w.done:
		return ErrWorkerClosed
	default:
	}
	_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
	if _, err := w.conn.Write(frame); err != nil {
		return fmt.Errorf("mqtttest: write: %w", err)
	}
	return nil
}

// reserve allocates a packet id for an outbound flow and the channel its
// answer arrives on.
func (w *Worker) reserve() (uint16, chan ack, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.done:
		return 0, nil, ErrWorkerClosed
	default:
	}
	// Ids count down from 65535: mochi keeps inbound and outbound packet ids
	// in one inflight map and numbers its deliveries upwards from 1, so an id
	// of ours equal to one of its unanswered deliveries would be refused
	// (0x91) or, for a PUBLISH, erase that delivery's entry.
	for range 65535 {
		w.mu.nextID-- // 0 wraps to 65535
		if w.mu.nextID == 0 {
			w.mu.nextID = 65535
		}
		if _, busy := w.mu.pending[w.mu.nextID]; !busy {
			ch := make(chan ack, 1)
			w.mu.pending[w.mu.nextID] = ch
			return w.mu.nextID, ch, nil
		}
	}
	return 0, nil, errors.New("mqtttest: all 65535 packet ids in use")
}

func (w *Worker) release(id uint16) {
	w.mu.Lock()
	delete(w.mu.pending, id)
	w.mu.Unlock()
}

// roundTrip writes frame and waits for the answer to packet id.
func (w *Worker) roundTrip(id uint16, ch chan ack, frame []byte) (ack, error) {
	defer w.release(id)
	w.wmu.Lock()
	err := w.writeLocked(frame)
	w.wmu.Unlock()
	if err != nil {
		return ack{}, err
	}
	t := time.NewTimer(w.timeout)
	defer t.Stop()
	select {
	case a := <-ch:
		return a, nil
	case <-w.done:
		select {
		case a := <-ch: // answered just before the end
			return a, nil
		default:
			return ack{}, ErrWorkerClosed
		}
	case <-t.C:
		return ack{}, ErrWorkerTimeout
	}
}

// complete hands an answer to the call waiting for packet id (if any).
func (w *Worker) complete(id uint16, a ack) {
	w.mu.Lock()
	ch := w.mu.pending[id]
	delete(w.mu.pending, id)
	w.mu.Unlock()
	if ch != nil {
		ch <- a // capacity 1, one answer per reservation
	}
}

func (w *Worker) pingLoop(every time.Duration) {
	defer w.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			w.wmu.Lock()
			err := w.writeLocked([]byte{typePingreq << 4, 0})
			w.wmu.Unlock()
			if err != nil {
				return
			}
		case <-w.quit:
			return
		case <-w.done:
			return
		}
	}
}

func (w *Worker) readLoop(r *bufio.Reader) {
	defer w.wg.Done()
	err := w.read(r)
	select {
	case <-w.quit:
		err = nil // we closed it
	default:
	}
	w.mu.Lock()
	w.mu.err = err
	w.mu.Unlock()
	_ = w.conn.Close()
	close(w.done)
	close(w.msgs)
}

// read decodes frames until the connection ends, returning why.
func (w *Worker) read(r *bufio.Reader) error {
	for {
		typ, flags, body, err := readFrame(r)
		if err != nil {
			return err
		}
		switch typ {
		case typePublish:
			m, err := decodePublish(flags, body)
			if err != nil {
				return err
			}
			select {
			case w.msgs <- m:
			case <-w.quit:
				return nil
			}
		case typePuback, typePubcomp:
			id, rc, err := decodeAck(body)
			if err != nil {
				return err
			}
			w.complete(id, ack{typ: typ, codes: []byte{rc}})
		case typePubrec:
			id, rc, err := decodeAck(body)
			if err != nil {
				return err
			}
			if rc >= 0x80 {
				w.complete(id, ack{typ: typ, codes: []byte{rc}})
				continue
			}
			w.wmu.Lock() // our QoS 2 publish goes on: PUBREL, then PUBCOMP completes it
			err = w.writeLocked(encodeAck(typePubrel, id, 0))
			w.wmu.Unlock()
			if err != nil {
				return err
			}
		case typePubrel: // the broker's QoS 2 delivery after our PUBREC
			id, _, err := decodeAck(body)
			if err != nil {
				return err
			}
			w.wmu.Lock()
			err = w.writeLocked(encodeAck(typePubcomp, id, 0))
			w.wmu.Unlock()
			if err != nil {
				return err
			}
		case typeSuback, typeUnsuback:
			id, codes, err := decodeSuback(body)
			if err != nil {
				return err
			}
			w.complete(id, ack{typ: typ, codes: codes})
		case typePingresp:
		case typeDisconnect:
			d := &DisconnectError{}
			if len(body) > 0 {
				d.ReasonCode = body[0]
			}
			if len(body) > 1 {
				if p, _, err := decodeProps(body[1:]); err == nil {
					d.Reason = p.reasonString
				}
			}
			return d
		default:
			return fmt.Errorf("%w: unexpected packet type %d", ErrMalformed, typ)
		}
	}
}

// --- encoding ---

// AppendVarint appends n as an MQTT variable byte integer.
func AppendVarint(b []byte, n int) []byte {
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

// AppendString appends s as an MQTT UTF-8 string (two-byte length, bytes).
func AppendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// frame prefixes body with the fixed header.
func frame(first byte, body []byte) []byte {
	out := AppendVarint([]byte{first}, len(body))
	return append(out, body...)
}

// withProps appends an MQTT 5 property block (length, then props).
func withProps(b, props []byte) []byte {
	b = AppendVarint(b, len(props))
	return append(b, props...)
}

func appendUserProps(b []byte, ps []UserProperty) []byte {
	for _, p := range ps {
		b = append(b, propUserProperty)
		b = AppendString(b, p.Key)
		b = AppendString(b, p.Value)
	}
	return b
}

func encodeConnect(clientID string, o WorkerOptions) []byte {
	flags := byte(0)
	if o.CleanStart {
		flags |= 0x02
	}
	if o.Username != "" {
		flags |= 0x80
	}
	if o.Password != "" {
		flags |= 0x40
	}
	b := AppendString(nil, "MQTT")
	b = append(b, 5, flags)
	b = binary.BigEndian.AppendUint16(b, o.KeepAlive)
	var props []byte
	if o.SessionExpiry > 0 {
		props = binary.BigEndian.AppendUint32(append(props, propSessionExpiry), o.SessionExpiry)
	}
	if o.ReceiveMaximum > 0 {
		props = binary.BigEndian.AppendUint16(append(props, propReceiveMaximum), o.ReceiveMaximum)
	}
	b = withProps(b, props)
	b = AppendString(b, clientID)
	if o.Username != "" {
		b = AppendString(b, o.Username)
	}
	if o.Password != "" {
		b = AppendString(b, o.Password)
	}
	return frame(typeConnect<<4, b)
}

func encodeSubscribe(id uint16, filter string, qos byte, keyFilters []string) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	var props []byte
	for _, f := range keyFilters {
		props = appendUserProps(props, []UserProperty{{KeyFilterProperty, f}})
	}
	b = withProps(b, props)
	b = AppendString(b, filter)
	b = append(b, qos&0x03)
	return frame(typeSubscribe<<4|0x02, b)
}

func encodeUnsubscribe(id uint16, filter string) []byte {
	b := binary.BigEndian.AppendUint16(nil, id)
	b = withProps(b, nil)
	b = AppendString(b, filter)
	return frame(typeUnsubscribe<<4|0x02, b)
}

func encodePublish(o Outgoing, id uint16) []byte {
	b := AppendString(nil, o.Topic)
	if o.QoS > 0 {
		b = binary.BigEndian.AppendUint16(b, id)
	}
	var props []byte
	if o.MessageExpiry > 0 {
		props = binary.BigEndian.AppendUint32(append(props, propMessageExpiry), o.MessageExpiry)
	}
	b = withProps(b, appendUserProps(props, o.User))
	b = append(b, o.Payload...)
	first := byte(typePublish<<4) | o.QoS<<1
	if o.Retain {
		first |= 0x01
	}
	return frame(first, b)
}

// encodeAck encodes PUBACK, PUBREC, PUBREL or PUBCOMP with a reason code.
func encodeAck(typ byte, id uint16, reason byte) []byte {
	first := typ << 4
	if typ == typePubrel {
		first |= 0x02
	}
	b := binary.BigEndian.AppendUint16(nil, id)
	if reason != 0 {
		b = append(b, reason) // no properties: the length may end here
	}
	return frame(first, b)
}

// --- decoding ---

// maxFrame bounds what the reader accepts (the MQTT maximum, 256 MiB).
const maxFrame = 268435455

func readFrame(r *bufio.Reader) (typ, flags byte, body []byte, err error) {
	first, err := r.ReadByte()
	if err != nil {
		return 0, 0, nil, err
	}
	n, mul := 0, 1
	for i := 0; ; i++ {
		if i == 4 {
			return 0, 0, nil, fmt.Errorf("%w: remaining length over 4 bytes", ErrMalformed)
		}
		d, err := r.ReadByte()
		if err != nil {
			return 0, 0, nil, err
		}
		n += int(d&0x7f) * mul
		mul *= 128
		if d&0x80 == 0 {
			break
		}
	}
	if n > maxFrame {
		return 0, 0, nil, fmt.Errorf("%w: remaining length %d", ErrMalformed, n)
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, 0, nil, err
	}
	return first >> 4, first & 0x0f, body, nil
}

// dec reads MQTT fields from a frame body; the first failure sticks.
type dec struct {
	b   []byte
	err error
}

func (d *dec) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: short %s", ErrMalformed, what)
	}
	d.b = nil
}

func (d *dec) byte1() byte {
	if len(d.b) < 1 {
		d.fail("byte")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) u16() uint16 {
	if len(d.b) < 2 {
		d.fail("two-byte integer")
		return 0
	}
	v := binary.BigEndian.Uint16(d.b)
	d.b = d.b[2:]
	return v
}

func (d *dec) u32() uint32 {
	if len(d.b) < 4 {
		d.fail("four-byte integer")
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *dec) varint() int {
	n, mul := 0, 1
	for i := range 4 {
		if len(d.b) <= i {
			break
		}
		c := d.b[i]
		n += int(c&0x7f) * mul
		mul *= 128
		if c&0x80 == 0 {
			d.b = d.b[i+1:]
			return n
		}
	}
	d.fail("variable byte integer")
	return 0
}

func (d *dec) bytesN(n int) []byte {
	if n < 0 || len(d.b) < n {
		d.fail("field")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) binary() []byte { return d.bytesN(int(d.u16())) }
func (d *dec) str() string    { return string(d.binary()) }

// props are the MQTT 5 properties the worker reads.
type props struct {
	payloadFormat    byte
	messageExpiry    uint32
	hasExpiry        bool
	contentType      string
	responseTopic    string
	correlationData  []byte
	subscriptionIDs  []int
	assignedClientID string
	serverKeepAlive  uint16
	reasonString     string
	receiveMaximum   uint16
	maximumQoS       byte
	hasMaximumQoS    bool
	topicAlias       uint16
	user             []UserProperty
}

// decodeProps reads a property block (length first) from b and returns the
// properties and the rest of b.
func decodeProps(b []byte) (props, []byte, error) {
	d := &dec{b: b}
	n := d.varint()
	block := d.bytesN(n)
	if d.err != nil {
		return props{}, nil, d.err
	}
	rest := d.b
	var p props
	pd := &dec{b: block}
	for len(pd.b) > 0 && pd.err == nil {
		switch id := pd.byte1(); id {
		case propPayloadFormat:
			p.payloadFormat = pd.byte1()
		case propMessageExpiry:
			p.messageExpiry, p.hasExpiry = pd.u32(), true
		case propContentType:
			p.contentType = pd.str()
		case propResponseTopic:
			p.responseTopic = pd.str()
		case propCorrelationData:
			p.correlationData = pd.binary()
		case propSubscriptionID:
			p.subscriptionIDs = append(p.subscriptionIDs, pd.varint())
		case propAssignedClientID:
			p.assignedClientID = pd.str()
		case propServerKeepAlive:
			p.serverKeepAlive = pd.u16()
		case propReasonString:
			p.reasonString = pd.str()
		case propReceiveMaximum:
			p.receiveMaximum = pd.u16()
		case propMaximumQoS:
			p.maximumQoS, p.hasMaximumQoS = pd.byte1(), true
		case propTopicAlias:
			p.topicAlias = pd.u16()
		case propUserProperty:
			k := pd.str()
			v := pd.str()
			p.user = append(p.user, UserProperty{k, v})
		case propSessionExpiry, propWillDelay, propMaximumPacketSize:
			pd.u32()
		case propTopicAliasMaximum:
			pd.u16()
		case propRequestProblem, propRequestResponse, propRetainAvailable,
			propWildcardAvailable, propSubIDAvailable, propSharedAvailable:
			pd.byte1()
		case propAuthMethod, propResponseInfo, propServerReference:
			pd.str()
		case propAuthData:
			pd.binary()
		default:
			return props{}, nil, fmt.Errorf("%w: unknown property 0x%02x", ErrMalformed, id)
		}
	}
	if pd.err != nil {
		return props{}, nil, pd.err
	}
	return p, rest, nil
}

func decodeConnack(body []byte) (Connack, error) {
	d := &dec{b: body}
	flags := d.byte1()
	c := Connack{SessionPresent: flags&1 == 1, ReasonCode: d.byte1(), MaximumQoS: 2}
	if d.err != nil {
		return Connack{}, d.err
	}
	if len(d.b) == 0 {
		return c, nil
	}
	p, _, err := decodeProps(d.b)
	if err != nil {
		return Connack{}, err
	}
	c.ReceiveMaximum, c.ServerKeepAlive = p.receiveMaximum, p.serverKeepAlive
	c.AssignedClientID, c.ReasonString, c.User = p.assignedClientID, p.reasonString, p.user
	if p.hasMaximumQoS {
		c.MaximumQoS = p.maximumQoS
	}
	return c, nil
}

func decodePublish(flags byte, body []byte) (*WorkerMessage, error) {
	m := &WorkerMessage{Dup: flags&0x08 != 0, QoS: (flags >> 1) & 0x03, Retain: flags&0x01 != 0}
	if m.QoS == 3 {
		return nil, fmt.Errorf("%w: PUBLISH with QoS 3", ErrMalformed)
	}
	d := &dec{b: body}
	m.Topic = d.str()
	if m.QoS > 0 {
		m.PacketID = d.u16()
	}
	if d.err != nil {
		return nil, d.err
	}
	p, rest, err := decodeProps(d.b)
	if err != nil {
		return nil, err
	}
	if p.topicAlias != 0 {
		return nil, fmt.Errorf("%w: topic alias %d, but the worker allows none", ErrMalformed, p.topicAlias)
	}
	m.Payload = rest
	m.User = p.user
	m.Key, _ = m.Prop(KeyProperty)
	m.MessageExpiry, m.HasExpiry = p.messageExpiry, p.hasExpiry
	m.ContentType, m.ResponseTopic, m.CorrelationData = p.contentType, p.responseTopic, p.correlationData
	m.PayloadFormat, m.SubscriptionIDs = p.payloadFormat, p.subscriptionIDs
	return m, nil
}

// decodeAck decodes PUBACK, PUBREC, PUBREL or PUBCOMP: packet id and reason
// code (success when the length ends after the id).
func decodeAck(body []byte) (uint16, byte, error) {
	d := &dec{b: body}
	id := d.u16()
	var rc byte
	if len(d.b) > 0 {
		rc = d.byte1()
	}
	return id, rc, d.err
}

func decodeSuback(body []byte) (uint16, []byte, error) {
	d := &dec{b: body}
	id := d.u16()
	if d.err != nil {
		return 0, nil, d.err
	}
	_, rest, err := decodeProps(d.b)
	if err != nil {
		return 0, nil, err
	}
	return id, rest, nil
}
