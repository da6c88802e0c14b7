package mqtttest

// The worker's plumbing: writes, packet ids and round trips, the reader
// goroutine and the keep-alive pinger.

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

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

// write writes one frame, taking w.wmu.
func (w *Worker) write(frame []byte) error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	return w.writeLocked(frame)
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
	if err := w.write(frame); err != nil {
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
			if err := w.write(mqttwire.AppendPingreq(nil)); err != nil {
				return
			}
		case <-w.quit:
			return
		case <-w.done:
			return
		}
	}
}

func (w *Worker) readLoop(r *mqttwire.Reader) {
	defer w.wg.Done()
	err := w.read(r)
	select {
	case <-w.quit:
		err = nil // we closed it
	default:
		if w.leaving.Load() {
			err = nil // the broker closed after our DISCONNECT
		}
	}
	w.mu.Lock()
	w.mu.err = err
	w.mu.Unlock()
	_ = w.conn.Close()
	close(w.done)
	close(w.msgs)
}

// read decodes frames until the connection ends, returning why.
func (w *Worker) read(r *mqttwire.Reader) error {
	for {
		p, err := r.Next()
		if err != nil {
			return err
		}
		switch p.Type {
		case mqttwire.TypePublish:
			m, err := decodeMessage(p)
			if err != nil {
				return err
			}
			select {
			case w.msgs <- m:
			case <-w.quit:
				return nil
			}
		case mqttwire.TypePuback, mqttwire.TypePubcomp:
			a, err := mqttwire.DecodeAck(mqttwire.Version5, p)
			if err != nil {
				return err
			}
			w.complete(a.PacketID, ack{typ: p.Type, codes: []byte{a.ReasonCode}})
		case mqttwire.TypePubrec:
			a, err := mqttwire.DecodeAck(mqttwire.Version5, p)
			if err != nil {
				return err
			}
			if a.ReasonCode >= 0x80 {
				w.complete(a.PacketID, ack{typ: p.Type, codes: []byte{a.ReasonCode}})
				continue
			}
			if err := w.write(mqttwire.AppendAck(nil, mqttwire.TypePubrel, a.PacketID, 0)); err != nil {
				return err // our QoS 2 publish goes on: PUBREL, then PUBCOMP completes it
			}
		case mqttwire.TypePubrel: // the broker's QoS 2 delivery after our PUBREC
			a, err := mqttwire.DecodeAck(mqttwire.Version5, p)
			if err != nil {
				return err
			}
			if err := w.write(mqttwire.AppendAck(nil, mqttwire.TypePubcomp, a.PacketID, 0)); err != nil {
				return err
			}
		case mqttwire.TypeSuback, mqttwire.TypeUnsuback:
			s, err := mqttwire.DecodeSuback(mqttwire.Version5, p)
			if err != nil {
				return err
			}
			w.complete(s.PacketID, ack{typ: p.Type, codes: bytes.Clone(s.ReasonCodes)})
		case mqttwire.TypePingresp:
		case mqttwire.TypeDisconnect:
			return decodeDisconnect(p)
		default:
			return fmt.Errorf("%w: unexpected %s from the broker", ErrMalformed, mqttwire.TypeName(p.Type))
		}
	}
}
