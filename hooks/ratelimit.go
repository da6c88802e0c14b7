package hooks

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/time/rate"
)

// RateLimits are the broker's rate limits (token buckets, golang.org/x/time/rate):
//   - CONNECTs per second per listener and per source address: past them a
//     CONNECT is answered 0x9F Connection rate exceeded (MQTT 3.1.1: 0x03
//     Server unavailable) before its password is checked;
//   - PUBLISH messages and bytes (topic and payload) per second per client
//     and per user (one bucket for all the user's connections): past them
//     the broker stops reading that connection until the bucket has
//     refilled, so TCP pushes back on the client; nothing is dropped;
//   - CONNECTs per second per user, counted once the CONNECT has
//     authenticated (so that nobody can lock a user out by sending CONNECTs
//     in its name): past it, 0x9F (3.1.1: 0x03) instead of the CONNACK.
//
// A zero rate is no limit. Each bucket holds one second's worth (at least
// one message, or one packet's bytes at most: a packet larger than a
// second's bytes waits a full second), but a source address's CONNECT
// bucket, which holds ten seconds' worth. Set changes the rates at run time.
type RateLimits struct {
	mqtt.HookBase
	settings atomic.Pointer[RateSettings]

	mu        sync.Mutex
	listeners map[string]*rate.Limiter
	addrs     map[string]*rate.Limiter // bounded by maxRateAddrs
	clients   sync.Map                 // *mqtt.Client -> *clientState

	users atomic.Pointer[map[string]*userLimits] // made by Set; nil entries: none

	// RefusedListener, RefusedAddress and RefusedUser count CONNECTs
	// refused, by scope.
	RefusedListener, RefusedAddress, RefusedUser atomic.Uint64
	// ThrottledNanos is the time connections spent not being read because
	// of the per-client limits; Throttled counts the waits.
	ThrottledNanos, Throttled atomic.Uint64
}

// RateSettings are the rates, per second; 0: no limit.
type RateSettings struct {
	ConnectPerListener, ConnectPerAddress float64
	MessagesPerClient, BytesPerClient     float64
	// Users are the rates of named users (the user name a client
	// authenticated as: its certificate's identity, its token's user, or
	// its CONNECT's); users not named have no per-user limit.
	Users map[string]UserRates
}

// UserRates are one user's rates, per second; 0: no limit.
type UserRates struct {
	Messages, Bytes, Connects float64
}

// userLimits are one user's buckets, shared by its connections.
type userLimits struct{ msgs, bytes, connects *rate.Limiter }

// NewRateLimits returns the hook with rates s.
func NewRateLimits(s RateSettings) *RateLimits {
	h := &RateLimits{}
	h.Set(s)
	return h
}

// Set puts new rates in force: CONNECT and user buckets start afresh
// (full), and each client's at its next publish.
func (h *RateLimits) Set(s RateSettings) {
	users := make(map[string]*userLimits, len(s.Users))
	for name, r := range s.Users {
		users[name] = &userLimits{msgs: newBucket(r.Messages), bytes: newBucket(r.Bytes), connects: newBucket(r.Connects)}
	}
	h.mu.Lock()
	h.settings.Store(&s)
	h.users.Store(&users)
	h.listeners, h.addrs = nil, nil
	h.mu.Unlock()
}

// newBucket is a token bucket of perSecond holding a second's worth (at
// least 1); nil for no limit.
func newBucket(perSecond float64) *rate.Limiter {
	if perSecond <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond)))
}

// maxRateAddrs bounds the source addresses RateLimits tracks: when full, the
// addresses whose bucket is full again (idle for a second) are forgotten.
const maxRateAddrs = 65536

// ID returns the hook's id.
func (h *RateLimits) ID() string { return "keyline-rate-limits" }

// Provides reports that RateLimits implements OnConnect and OnDisconnect.
func (h *RateLimits) Provides(b byte) bool { return b == mqtt.OnConnect || b == mqtt.OnDisconnect }

// OnDisconnect forgets the client's buckets.
func (h *RateLimits) OnDisconnect(cl *mqtt.Client, _ error, _ bool) { h.clients.Delete(cl) }

var errConnectRate = errors.New("connection rate exceeded")

// OnConnect refuses a CONNECT past its listener's or its address's rate.
func (h *RateLimits) OnConnect(cl *mqtt.Client, _ packets.Packet) error {
	set := h.settings.Load()
	if cl.Net.Inline || (set.ConnectPerListener <= 0 && set.ConnectPerAddress <= 0) {
		return nil
	}
	now := time.Now()
	h.mu.Lock()
	set = h.settings.Load() // as Set left it, with the maps
	ok, scope := true, ""
	if set.ConnectPerListener > 0 {
		if !limiterOf(&h.listeners, cl.Net.Listener, set.ConnectPerListener, 1).AllowN(now, 1) {
			ok, scope = false, "listener"
			h.RefusedListener.Add(1)
		}
	}
	if ok && set.ConnectPerAddress > 0 {
		host := cl.Net.Remote
		if hst, _, err := net.SplitHostPort(host); err == nil {
			host = hst
		}
		if h.addrs != nil && len(h.addrs) >= maxRateAddrs {
			for a, l := range h.addrs {
				if l.TokensAt(now) >= float64(l.Burst()) {
					delete(h.addrs, a)
				}
			}
		}
		if len(h.addrs) < maxRateAddrs || h.addrs[host] != nil {
			if !limiterOf(&h.addrs, host, set.ConnectPerAddress, addressBurst).AllowN(now, 1) {
				ok, scope = false, "address"
				h.RefusedAddress.Add(1)
			}
		} // else every tracked address is busy: this one goes unlimited rather than evicting a busy one
	}
	h.mu.Unlock()
	if ok {
		return nil
	}
	h.Log.Info("refused a CONNECT past the connection rate", "scope", scope, "listener", cl.Net.Listener, "remote", cl.Net.Remote, "client", clip(cl.ID))
	refuseConnect(cl, packets.ErrConnectionRateExceeded, packets.Err3ServerUnavailable, errConnectRate)
	return errConnectRate
}

// addressBurst is how many seconds' worth a source address's CONNECT
// bucket holds: a NAT'd fleet's devices reconnecting at once after a
// restart get in together, a loop reconnecting for longer does not.
const addressBurst = 10

// limiterOf returns m's bucket for key, made with perSecond and holding
// seconds' worth.
func limiterOf(m *map[string]*rate.Limiter, key string, perSecond, seconds float64) *rate.Limiter {
	if *m == nil {
		*m = map[string]*rate.Limiter{}
	}
	l := (*m)[key]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond*seconds)))
		(*m)[key] = l
	}
	return l
}
