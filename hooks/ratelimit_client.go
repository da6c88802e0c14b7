package hooks

import (
	"errors"
	"sync"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/time/rate"
)

// clientState is what RateLimits keeps of one connection: its buckets
// (made under set, remade when the settings change) and its figures.
type clientState struct {
	// set, msgs, bytes and user are used by the client's read goroutine
	// only.
	set         *RateSettings
	msgs, bytes *rate.Limiter
	user        *userLimits // nil: no per-user limit

	mu sync.Mutex // guards the figures, read by the admin API
	// sec is the unix second cur* count in; prev* are the second before.
	sec                 int64
	curMsgs, curBytes   uint64
	prevMsgs, prevBytes uint64
	throttled           time.Duration
}

// ClientRates are one connection's inbound figures.
type ClientRates struct {
	// MessagesPerSec and BytesPerSec are the PUBLISH messages and bytes
	// (topic and payload) read in the last whole second.
	MessagesPerSec, BytesPerSec float64
	// Throttled is the time the connection was not read because of the
	// client's or its user's rates.
	Throttled time.Duration
}

// Rates returns cl's inbound figures at now (zero for a client that has
// published nothing).
func (h *RateLimits) Rates(cl *mqtt.Client, now time.Time) ClientRates {
	v, ok := h.clients.Load(cl)
	if !ok {
		return ClientRates{}
	}
	c := v.(*clientState)
	c.mu.Lock()
	defer c.mu.Unlock()
	r := ClientRates{Throttled: c.throttled}
	switch now.Unix() {
	case c.sec: // the second before is the last whole one
		r.MessagesPerSec, r.BytesPerSec = float64(c.prevMsgs), float64(c.prevBytes)
	case c.sec + 1:
		r.MessagesPerSec, r.BytesPerSec = float64(c.curMsgs), float64(c.curBytes)
	}
	return r
}

// count adds a message of n bytes and a wait to the figures at now.
func (c *clientState) count(now time.Time, n int, wait time.Duration) {
	c.mu.Lock()
	if s := now.Unix(); s != c.sec {
		if s == c.sec+1 {
			c.prevMsgs, c.prevBytes = c.curMsgs, c.curBytes
		} else {
			c.prevMsgs, c.prevBytes = 0, 0
		}
		c.sec, c.curMsgs, c.curBytes = s, 0, 0
	}
	c.curMsgs++
	c.curBytes += uint64(n)
	c.throttled += max(wait, 0)
	c.mu.Unlock()
}

// ReadPacket (a PacketReader step) counts a PUBLISH in the client's figures
// and waits, in the connection's read goroutine, until the client's and its
// user's buckets allow it. The client's state is made at its first publish
// and forgotten when it disconnects.
func (h *RateLimits) ReadPacket(cl *mqtt.Client, pk *packets.Packet) {
	if pk.FixedHeader.Type != packets.Publish || cl.Net.Inline {
		return
	}
	set := h.settings.Load()
	var c *clientState
	if v, ok := h.clients.Load(cl); ok {
		c = v.(*clientState)
	} else {
		c = &clientState{}
		h.clients.Store(cl, c)
	}
	if c.set != set { // only the client's read goroutine gets here: no race on these fields
		c.set, c.msgs, c.bytes = set, newBucket(set.MessagesPerClient), newBucket(set.BytesPerClient)
		c.user = nil
		if u := (*h.users.Load())[string(cl.Properties.Username)]; u != nil && (u.msgs != nil || u.bytes != nil) {
			c.user = u
		}
	}
	now := time.Now()
	n := len(pk.TopicName) + len(pk.Payload)
	wait := max(reserve(c.msgs, now, 1), reserve(c.bytes, now, n))
	if c.user != nil {
		wait = max(wait, reserve(c.user.msgs, now, 1), reserve(c.user.bytes, now, n))
	}
	if wait < minThrottle {
		wait = 0 // the tokens are taken: the debt carries to the next publish
	}
	c.count(now, n, wait)
	if wait <= 0 {
		return
	}
	h.Throttled.Add(1)
	h.ThrottledNanos.Add(uint64(wait))
	// Not reading is the point: the client's socket fills and TCP pushes
	// back. The wait is at most about a second per bucket (a bucket holds
	// a second).
	time.Sleep(wait)
}

// minThrottle is the shortest wait ReadPacket sleeps: a shorter one is
// carried (the buckets' tokens are taken, so the next publish's wait grows)
// until it adds up to this. A connection held at its rate is then woken
// about a hundred times a second, reading what came meanwhile in one go,
// rather than once per message (a profile of one publisher held at 1,000
// msg/s spent most of the broker's time in the per-message read and write
// syscalls of waking for each); it gets ahead of its rate by at most 10 ms'
// worth.
const minThrottle = 10 * time.Millisecond

// reserve takes n tokens (at most a bucket's worth) from l at now and
// returns how long to wait for them; 0 for a nil l.
func reserve(l *rate.Limiter, now time.Time, n int) time.Duration {
	if l == nil {
		return 0
	}
	return l.ReserveN(now, min(n, l.Burst())).DelayFrom(now)
}

var errUserConnectRate = errors.New("connection rate of the user exceeded")

// AdmitUser reports whether a CONNECT that authenticated as user is within
// the user's CONNECT rate; if not, it answers the CONNECT 0x9F (3.1.1:
// 0x03) and closes the connection, and the caller refuses it.
func (h *RateLimits) AdmitUser(cl *mqtt.Client, user string) bool {
	u := (*h.users.Load())[user]
	if u == nil || u.connects == nil || cl.Net.Inline || u.connects.Allow() {
		return true
	}
	h.RefusedUser.Add(1)
	h.Log.Info("refused a CONNECT past the user's connection rate", "user", clip(user), "listener", cl.Net.Listener, "remote", cl.Net.Remote, "client", clip(cl.ID))
	refuseConnect(cl, packets.ErrConnectionRateExceeded, packets.Err3ServerUnavailable, errUserConnectRate)
	return false
}
