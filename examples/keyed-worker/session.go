package main

import (
	"errors"
	"io"
	"sync"

	"github.com/eclipse/paho.golang/packets"
	"github.com/eclipse/paho.golang/paho/session/state"
)

// MQTT 5 reason codes a worker answers a message with. Key-Shared reads a
// PUBACK (QoS 1) or PUBREC (QoS 2) with a reason code >= 0x80 as a nack:
// 0x80 is retried after the broker's backoff, 0x87 and 0x99 are
// dead-lettered at once.
const (
	ReasonSuccess              byte = 0x00
	ReasonUnspecifiedError     byte = 0x80
	ReasonPayloadFormatInvalid byte = 0x99
)

// answerSession is paho.golang's in-memory session state with what a
// Key-Shared worker needs besides: a message is answered when the worker is
// done with it, not when paho's handler returns, and the answer may be a
// failure reason code (paho.golang v0.23 acknowledges every message with 0,
// success). Copy this file into your worker as it is.
//
// paho calls Ack once its handlers have returned, in the order the messages
// arrived; the worker calls answer when it is done, in any order. The
// acknowledgements go out in arrival order, as MQTT requires
// [MQTT-4.6.0-2]: one finished early waits for those that came before it.
type answerSession struct {
	*state.State

	mu      sync.Mutex
	conn    io.Writer // the live connection; nil between connections
	gen     uint64    // counts connections: an answer names the one its message came on
	order   []*answer // registered by Ack, in arrival order, not sent yet
	byID    map[uint16]*answer
	flushed error // the last write error
}

type answer struct {
	pb       *packets.Publish // nil until paho called Ack
	reason   byte
	answered bool
}

func newAnswerSession() *answerSession {
	return &answerSession{State: state.NewInMemory(), byID: map[uint16]*answer{}}
}

// ConAckReceived records the connection the acknowledgements go to.
func (s *answerSession) ConAckReceived(conn io.Writer, cp *packets.Connect, ca *packets.Connack) error {
	s.mu.Lock()
	s.conn = conn
	s.gen++
	s.mu.Unlock()
	return s.State.ConAckReceived(conn, cp, ca)
}

// connection returns the number of the current connection.
func (s *answerSession) connection() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// errConnectionGone answers a message that came on a connection since lost:
// the broker delivers it again.
var errConnectionGone = errors.New("the connection the message came on is gone")

// ConnectionLost forgets the connection and the answers not sent on it:
// the broker delivers those messages again.
func (s *answerSession) ConnectionLost(dp *packets.Disconnect) error {
	s.mu.Lock()
	s.conn, s.order = nil, nil
	clear(s.byID)
	s.mu.Unlock()
	return s.State.ConnectionLost(dp)
}

// Ack is paho's call once its handlers have returned: pb's acknowledgement
// waits for the worker's answer (and for those of the messages before it).
func (s *answerSession) Ack(pb *packets.Publish) error {
	if pb.QoS == 0 {
		return nil // nothing to acknowledge
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.byID[pb.PacketID]
	if a == nil {
		a = &answer{}
		s.byID[pb.PacketID] = a
	}
	a.pb = pb
	s.order = append(s.order, a)
	return s.flushLocked()
}

// answer records the worker's answer to the message with packet id that
// came on connection gen: reason 0 acknowledges it, >= 0x80 refuses it. It
// returns the error of the last write, if one failed (the connection is
// gone: the broker delivers the message again).
func (s *answerSession) answer(gen uint64, id uint16, reason byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen || s.conn == nil {
		return errConnectionGone // its packet id may be another message's now
	}
	a := s.byID[id]
	if a == nil { // the worker was faster than paho's call to Ack
		a = &answer{}
		s.byID[id] = a
	}
	a.reason, a.answered = reason, true
	return s.flushLocked()
}

// flushLocked writes the acknowledgements that may go: those at the front
// of the arrival order that have their answer.
func (s *answerSession) flushLocked() error {
	for len(s.order) > 0 && s.order[0].answered {
		a := s.order[0]
		s.order = s.order[1:]
		delete(s.byID, a.pb.PacketID)
		if err := s.write(a); err != nil {
			s.flushed = err
		}
	}
	err := s.flushed
	s.flushed = nil
	return err
}

// write sends one acknowledgement: a success through paho's state (which
// records a QoS 2 PUBREC to spot a resent PUBLISH), a failure here. A failed
// PUBREC ends a QoS 2 flow: the broker sends no PUBREL.
func (s *answerSession) write(a *answer) error {
	if a.reason < 0x80 {
		return s.State.Ack(a.pb)
	}
	props := &packets.Properties{}
	var err error
	switch a.pb.QoS {
	case 1:
		_, err = (&packets.Puback{PacketID: a.pb.PacketID, ReasonCode: a.reason, Properties: props}).WriteTo(s.conn)
	case 2:
		_, err = (&packets.Pubrec{PacketID: a.pb.PacketID, ReasonCode: a.reason, Properties: props}).WriteTo(s.conn)
	}
	return err
}
