package outbox

// What an outbox shows operators (the admin API, the console): read under
// its lock, never changing it.

// Gone reports whether the outbox was discarded.
func (o *Outbox) Gone() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.gone
}

// Len returns the messages held and how many of them are in flight on the
// current connection.
func (o *Outbox) Len() (held, inflight int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.live, o.mu.inflight
}

// Info describes one held message, for operators.
type Info struct {
	PacketID uint16
	Topic    string // a view into the held frame: copy it to keep it
	QoS      byte
	Size     int
	Created  int64 // unix seconds
	InFlight bool  // on the current connection's wire
	Released bool  // QoS 2: PUBREC received, PUBREL sent
	// Cold: its frame is on disk only (restored and not loaded yet, or
	// spilled); Topic is empty and Size the frame's.
	Cold bool
}

// Snapshot lists at most n held messages, oldest first.
func (o *Outbox) Snapshot(n int) []Info {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []Info
	for i := o.mu.head; i < len(o.mu.q) && len(out) < n; i++ {
		e := &o.mu.q[i]
		if e.pub == nil {
			continue
		}
		if e.isCold() || e.isSpilled() {
			out = append(out, Info{PacketID: e.id, QoS: e.qos, Size: int(e.size), Created: e.created, Released: e.state == stReleased, Cold: true})
			continue
		}
		out = append(out, Info{PacketID: e.id, Topic: e.pub.Topic, QoS: e.pub.QoS, Size: len(e.pub.Payload()),
			Created: e.created, InFlight: i < o.mu.cursor, Released: e.state == stReleased})
	}
	return out
}
