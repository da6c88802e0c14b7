package keyshared

import "time"

// UserProperty is one MQTT 5 user property, kept in the order the publisher sent it.
type UserProperty struct {
	Key string
	Val string
}

// Properties are the MQTT 5 publish properties a group log keeps with each message
// so that a member receives them as the publisher sent them.
type Properties struct {
	// PayloadFormat is the payload format indicator; valid only when PayloadFormatSet.
	PayloadFormat    byte
	PayloadFormatSet bool
	ContentType      string
	ResponseTopic    string
	CorrelationData  []byte
	User             []UserProperty
}

// Message is one entry of a group log as the dispatcher sees it.
type Message struct {
	// Offset is the message's position in its group log. Offsets start at 1 and
	// strictly increase with every append; they are never reused.
	Offset uint64
	// Key is the routing key: the key user property, else the topic.
	Key     string
	Topic   string
	Payload []byte
	// QoS is the QoS the message was published with (1 or 2 on the reliable path).
	QoS   byte
	Props Properties
	// PublishedAt is when the broker accepted the message.
	PublishedAt time.Time
	// ExpiresAt is when the message expires (MQTT 5 message expiry); zero means never.
	ExpiresAt time.Time
}

// Size is what the message costs in memory, roughly: its strings and
// payload plus a fixed overhead. Byte bounds (Config.WindowBytes) count it.
func (m *Message) Size() int {
	n := 160 + len(m.Key) + len(m.Topic) + len(m.Payload) + len(m.Props.ContentType) +
		len(m.Props.ResponseTopic) + len(m.Props.CorrelationData)
	for _, u := range m.Props.User {
		n += 32 + len(u.Key) + len(u.Val)
	}
	return n
}

// Expired reports whether the message has expired at now.
func (m *Message) Expired(now time.Time) bool {
	return !m.ExpiresAt.IsZero() && !now.Before(m.ExpiresAt)
}

// DeadLetter is a message that a group gave up on: it exhausted its deliveries
// under the dead-letter poison policy, or a member rejected it without retry.
type DeadLetter struct {
	Group   string
	Message Message
	// Attempts counts deliveries that ended in a nack, an ack timeout or the loss of the member.
	Attempts int
	// Reason is the last MQTT reason code a member answered with; 0 when the last
	// attempt ended in a timeout or the loss of the member.
	Reason        byte
	FirstDelivery time.Time
	LastDelivery  time.Time
	// DeadAt is when the message was dead-lettered.
	DeadAt time.Time
}

// Log is the durable log of one group, as the dispatcher needs it. Two
// implement it: the persistence package over its segment log (one node),
// and the cluster package over the group's JetStream stream, on the node
// holding the group's lease; tests use an in-memory one. Appends do not pass
// through the dispatcher: the broker appends to the group's store and then
// tells the dispatcher that new data is available (Dispatcher.Notify).
//
// The dispatcher calls a Log from its own goroutine only.
type Log interface {
	// ReadFrom appends to buf up to max unresolved messages whose offset is
	// >= from, in ascending offset order, and returns the extended slice.
	// Offsets may have gaps (resolved or dropped entries); fewer than max
	// messages means the log has nothing more at this moment.
	ReadFrom(from uint64, max int, buf []Message) ([]Message, error)
	// Head returns the offset of the last appended message, 0 when the log has
	// never held one.
	Head() uint64
	// LoadCursor returns the cursor to resume from: every offset <= cursor is
	// resolved (acked, dead-lettered, dropped by policy or expired).
	LoadCursor() (uint64, error)
	// Resolve records that the messages at offsets are resolved. It must not
	// block and must not keep offsets after it returns; the records become
	// durable with the log's next commit, so after a crash at most the
	// resolutions of the last commit interval are lost (those messages are
	// delivered again). ReadFrom never returns a resolved message again.
	Resolve(offsets []uint64)
	// DeadLetter durably records a dead letter before it returns; only then
	// may its offset be resolved.
	DeadLetter(d DeadLetter) error
}
