package outbox

import (
	"errors"

	"github.com/keyline-mq/keyline/internal/frame"
)

// Conn is the connection an outbox sends on.
type Conn interface {
	// Send queues a publish with its packet id and DUP flag. ErrNoRoom-like
	// refusals are reported with NoRoom (nothing was queued; wake is called
	// when there is room); any other error means the connection is gone.
	Send(p *frame.Publish, id uint16, dup bool, wake func()) error
	// Release writes a PUBREL for id.
	Release(id uint16) error
	// Missed tells the connection n messages were dropped (for its drop signal).
	Missed(n uint64)
}

// NoRoom is what Conn.Send returns when it queued nothing for lack of room.
var NoRoom = errors.New("outbox: connection has no room now")

// Store keeps a persistent session's outbox: where its messages survive a
// restart (the bbolt store keeps their records) or a move to another node
// (the cluster's store ties each message to its reference, a JetStream
// sequence, and records how far the session has got). Writes may be
// behind: a crash can lose the newest. The outbox calls it with its own
// lock held, in the order things happen to the session's messages.
type Store interface {
	// Put records message m of client: just added, or its packet id or
	// state changed. m is valid only during the call.
	Put(client string, m Stored)
	// Delete forgets message seq of client, whose reference was ref:
	// acknowledged, expired unsent, or dropped.
	Delete(client string, seq, ref uint64)
	// PutMeta records the session's own record (see record.go).
	PutMeta(client string, meta []byte)
	// DeleteSession forgets everything of client: the session ended, or is
	// no longer persistent.
	DeleteSession(client string)
}

// Stored is one message of an outbox as its Store sees it.
type Stored struct {
	Seq uint64 // the message's place in the session: publish order
	Ref uint64 // what the caller of Add gave (0: none)
	e   *entry
}

// Record returns the message's stored form, as Restore reads it.
func (m Stored) Record() []byte { return appendRecord(nil, m.e) }

// DurableStore is a Store that can tell when a record is durable, so that
// the publisher of a message for a persistent session is acknowledged only
// once the message is stored (or is refused).
type DurableStore interface {
	Store
	// PutDurable is Put, calling done with the outcome once the record is
	// durable (nil) or its write failed; done must be short.
	PutDurable(client string, m Stored, done func(error))
}

// Loader is a Store that reads a session's records back, for messages
// held cold (restored with RestoreCold, or past a Spill's threshold): they
// are loaded when they are to be sent.
type Loader interface {
	Store
	// Records returns the client's stored message records, in seq order.
	Records(client string) ([]Record, error)
	// Record returns the committed record of seq, nil when there is none.
	Record(client string, seq uint64) ([]byte, error)
}
