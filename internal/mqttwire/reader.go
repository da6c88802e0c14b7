package mqttwire

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// ErrTooLarge is Reader.Next's error for a frame longer than Reader.Limit.
var ErrTooLarge = errors.New("mqttwire: frame too large")

// Packet is one frame: its type, the flags of its first byte and its body.
type Packet struct {
	Type  byte
	Flags byte
	Body  []byte
}

// Reader reads frames from a connection through one buffer, decoding them in
// place: a frame that fits the buffer is not copied.
type Reader struct {
	// Limit, when positive, bounds a frame's remaining length: a longer
	// frame is an error wrapping ErrTooLarge, and none of it is read.
	Limit   int
	br      *bufio.Reader
	pending int          // bytes of the previous frame still in br, discarded by the next call
	large   bytes.Buffer // body of a frame larger than br's buffer; reused
}

// NewReader returns a Reader over r with a buffer of size bytes (4096 when
// size is under 16). Frames larger than the buffer are read into a second
// buffer that grows to the largest frame seen, as its bytes arrive.
func NewReader(r io.Reader, size int) *Reader {
	if size < 16 {
		size = 4096
	}
	return &Reader{br: bufio.NewReaderSize(r, size)}
}

// Buffered reports whether another frame (or part of one) has already been
// read from the connection, so that Next will not wait for its first byte.
// A caller that batches its writes flushes them when Buffered is false.
func (r *Reader) Buffered() bool { return r.br.Buffered() > r.pending }

// Next reads the next frame. Its Body aliases the Reader's buffers and is
// valid until the following call to Next. A read error is returned as it
// comes (io.EOF at a frame boundary, io.ErrUnexpectedEOF inside one); a
// remaining length over four bytes wraps ErrMalformed.
func (r *Reader) Next() (Packet, error) {
	if r.pending > 0 {
		if _, err := r.br.Discard(r.pending); err != nil {
			return Packet{}, err
		}
		r.pending = 0
	}
	var h Header
	if b, err := r.br.Peek(2); err == nil && b[1] < 0x80 {
		h = Header{Type: b[0] >> 4, Flags: b[0] & 0x0f, Remaining: int(b[1]), Size: 2} // most frames
	} else if h, err = r.header(); err != nil {
		return Packet{}, err
	}
	if r.Limit > 0 && h.Remaining > r.Limit {
		return Packet{}, fmt.Errorf("%w: %s of %d bytes, at most %d", ErrTooLarge, TypeName(h.Type), h.Remaining, r.Limit)
	}
	p := Packet{Type: h.Type, Flags: h.Flags}
	total := h.Size + h.Remaining
	if total <= r.br.Size() {
		full, err := r.br.Peek(total)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Packet{}, err
		}
		p.Body = full[h.Size:total:total]
		r.pending = total
		return p, nil
	}
	if _, err := r.br.Discard(h.Size); err != nil {
		return Packet{}, err
	}
	// The large buffer grows with what arrives, not with what the header
	// announces: a stray length of 256 MiB costs nothing until it is sent.
	r.large.Reset()
	if _, err := io.CopyN(&r.large, r.br, int64(h.Remaining)); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return Packet{}, err
	}
	p.Body = r.large.Bytes()
	return p, nil
}

// header peeks at a fixed header of any length.
func (r *Reader) header() (Header, error) {
	for i := 2; ; i++ {
		b, err := r.br.Peek(i)
		if err != nil {
			if err == io.EOF && len(b) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return Header{}, err
		}
		h, err := ParseHeader(b)
		if err != ErrIncomplete {
			return h, err
		}
	}
}
