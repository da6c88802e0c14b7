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
//   - PUBLISH messages and bytes (topic and payload) per second per client:
//     past them the broker stops reading that connection until the bucket
//     has refilled, so TCP pushes back on the client; nothing is dropped.
//
// A zero rate is no limit. Each bucket holds one second's worth (at least
// one message, or one packet's bytes at most: a packet larger than a
// second's bytes waits a full second). Set changes the rates at run time.
type RateLimits struct {
	mqtt.HookBase
	settings atomic.Pointer[RateSettings]

	mu        sync.Mutex
	listeners map[string]*rate.Limiter
	addrs     map[string]*rate.Limiter // bounded by maxRateAddrs
	clients   sync.Map                 // *mqtt.Client -> *clientLimits

	// Refused counts CONNECTs refused, by listener (0) and address (1).
	RefusedListener, RefusedAddress atomic.Uint64
	// ThrottledNanos is the time connections spent not being read because
	// of the per-client limits; Throttled counts the waits.
	ThrottledNanos, Throttled atomic.Uint64
}

// RateSettings are the rates, per second; 0: no limit.
type RateSettings struct {
	ConnectPerListener, ConnectPerAddress float64
	MessagesPerClient, BytesPerClient     float64
}

// NewRateLimits returns the hook with rates s.
func NewRateLimits(s RateSettings) *RateLimits {
	h := &RateLimits{}
	h.settings.Store(&s)
	return h
}

// Set puts new rates in force: CONNECT buckets start afresh (full), and each
// client's at its next publish.
func (h *RateLimits) Set(s RateSettings) {
	h.mu.Lock()
	h.settings.Store(&s)
	h.listeners, h.addrs = nil, nil
	h.mu.Unlock()
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
		if !limiterOf(&h.listeners, cl.Net.Listener, set.ConnectPerListener).AllowN(now, 1) {
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
			if !limiterOf(&h.addrs, host, set.ConnectPerAddress).AllowN(now, 1) {
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

func limiterOf(m *map[string]*rate.Limiter, key string, perSecond float64) *rate.Limiter {
	if *m == nil {
		*m = map[string]*rate.Limiter{}
	}
	l := (*m)[key]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(perSecond), max(1, int(perSecond)))
		(*m)[key] = l
	}
	return l
}

// clientLimits are one connection's inbound buckets, made under set.
type clientLimits struct {
	set         *RateSettings
	msgs, bytes *rate.Limiter
}

// ReadPacket (a PacketReader step) waits, in the connection's read
// goroutine, until the client's buckets allow this PUBLISH. The buckets are
// made at its first publish and forgotten when it disconnects.
func (h *RateLimits) ReadPacket(cl *mqtt.Client, pk *packets.Packet) {
	set := h.settings.Load()
	if pk.FixedHeader.Type != packets.Publish || cl.Net.Inline || (set.MessagesPerClient <= 0 && set.BytesPerClient <= 0) {
		return
	}
	var l *clientLimits
	if v, ok := h.clients.Load(cl); ok {
		l = v.(*clientLimits)
	}
	if l == nil || l.set != set { // only the client's read goroutine gets here: no race on the entry
		l = &clientLimits{set: set}
		if set.MessagesPerClient > 0 {
			l.msgs = rate.NewLimiter(rate.Limit(set.MessagesPerClient), max(1, int(set.MessagesPerClient)))
		}
		if set.BytesPerClient > 0 {
			l.bytes = rate.NewLimiter(rate.Limit(set.BytesPerClient), max(1, int(set.BytesPerClient)))
		}
		h.clients.Store(cl, l)
	}
	now := time.Now()
	var wait time.Duration
	if l.msgs != nil {
		wait = l.msgs.ReserveN(now, 1).DelayFrom(now)
	}
	if l.bytes != nil {
		n := min(len(pk.TopicName)+len(pk.Payload), l.bytes.Burst())
		wait = max(wait, l.bytes.ReserveN(now, n).DelayFrom(now))
	}
	if wait <= 0 {
		return
	}
	h.Throttled.Add(1)
	h.ThrottledNanos.Add(uint64(wait))
	// Not reading is the point: the client's socket fills and TCP pushes
	// back. The wait is at most about a second (a bucket holds a second).
	time.Sleep(wait)
}
