package keyshared

import "sync/atomic"

// member is one subscriber of the group (an MQTT client id).
type member struct {
	id      string
	recvMax int
	// limit is min(Config.MemberMaxInflight, recvMax when given). inflight
	// never grows past it through a delivery; it may exceed it only after a
	// re-subscribe lowered it, until acks bring it down.
	limit   int
	filters filterSet
	// canRead, when set, reports whether the member may read a topic; a
	// message it may not read is never offered to it (nil: every topic).
	canRead func(topic string) bool
	// fits, when set, reports whether the member can take a message (its
	// Maximum Packet Size); one it cannot take is never offered to it.
	fits func(m *Message) bool

	// active is false while the client is disconnected; no new message goes
	// to it and inactiveTicks counts heartbeats toward eviction.
	active        bool
	inactiveTicks int
	// paused is set when Deliver refused a message; it clears on the member's
	// next ack or the next heartbeat.
	paused bool
	// removed is set once the member left the group (removed or evicted).
	removed bool

	inflight int
	infl     memberList
	// full records that the member counts in MembersAtLimit.
	full bool
	// waitq holds the keys whose head routes to this member and waits for it
	// to take messages (room, reconnect, unpause).
	waitq keyList

	// stat mirrors inflight/limit/active for Stats readers on other goroutines.
	stat  *memberStat
	dirty bool
}

// memberSpec is what AddMember says of a member.
type memberSpec struct {
	recvMax int
	filters filterSet
	canRead func(topic string) bool
	fits    func(m *Message) bool
}

// canTake reports whether a message may be delivered to m now.
func (m *member) canTake() bool {
	return m.active && !m.paused && m.inflight < m.limit
}

// memberStat is a member's published state, read without the loop.
type memberStat struct {
	id       string
	inflight atomic.Int64
	limit    atomic.Int64
	active   atomic.Bool
}
