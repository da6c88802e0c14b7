package main

import (
	"encoding/binary"
	"math"
	"math/bits"
	"sync"
	"time"
)

// epoch is the load generator's time origin: payload timestamps are
// monotonic nanoseconds since it, read with now().
var epoch = time.Now()

func now() int64 { return int64(time.Since(epoch)) }

// Payload layout (little endian), at least payloadMin bytes:
//
//	0  uint32 run id (messages from another run are ignored)
//	4  uint32 publisher index
//	8  int64  send time, ns since the publisher's epoch (stamped just before write)
//	16 uint64 sequence number per publisher, from 1
//	24 uint32 key index (shared scenario; 0 otherwise)
//	28 uint32 sequence number per key, from 1 (0 when not keyed)
const (
	payloadMin = 32
	offTS      = 8
)

type payloadInfo struct {
	run    uint32
	pub    uint32
	ts     int64
	seq    uint64
	key    uint32
	keySeq uint32
}

func putPayload(b []byte, p payloadInfo) {
	binary.LittleEndian.PutUint32(b[0:], p.run)
	binary.LittleEndian.PutUint32(b[4:], p.pub)
	binary.LittleEndian.PutUint64(b[8:], uint64(p.ts))
	binary.LittleEndian.PutUint64(b[16:], p.seq)
	binary.LittleEndian.PutUint32(b[24:], p.key)
	binary.LittleEndian.PutUint32(b[28:], p.keySeq)
}

func getPayload(b []byte) (payloadInfo, bool) {
	if len(b) < payloadMin {
		return payloadInfo{}, false
	}
	return payloadInfo{
		run:    binary.LittleEndian.Uint32(b[0:]),
		pub:    binary.LittleEndian.Uint32(b[4:]),
		ts:     int64(binary.LittleEndian.Uint64(b[8:])),
		seq:    binary.LittleEndian.Uint64(b[16:]),
		key:    binary.LittleEndian.Uint32(b[24:]),
		keySeq: binary.LittleEndian.Uint32(b[28:]),
	}, true
}

// hist is a log-linear latency histogram in nanoseconds: exact below 128 ns,
// then 64 buckets per power of two (relative error under 1%). Not safe for
// concurrent use: each receiver owns one and they are merged at the end.
type hist struct {
	counts [64*58 + 128]uint32
	n      uint64
	sum    float64
	max    int64
}

func histIndex(v int64) int {
	if v < 128 {
		if v < 0 {
			return 0
		}
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - 7
	return 64*shift + int(v>>shift)
}

// histValue is the middle of bucket i.
func histValue(i int) int64 {
	if i < 128 {
		return int64(i)
	}
	shift := i/64 - 1
	m := int64(i%64 + 64)
	return m<<shift + (int64(1)<<shift)/2
}

func (h *hist) record(v int64) {
	if v < 0 {
		v = 0
	}
	h.counts[histIndex(v)]++
	h.n++
	h.sum += float64(v)
	if v > h.max {
		h.max = v
	}
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	if o.max > h.max {
		h.max = o.max
	}
}

// quantile returns the q-quantile (0 < q <= 1) in nanoseconds.
func (h *hist) quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank < 1 {
		rank = 1
	}
	var c uint64
	for i, n := range h.counts {
		c += uint64(n)
		if c >= rank {
			v := histValue(i)
			if v > h.max {
				v = h.max
			}
			return v
		}
	}
	return h.max
}

type latencyJSON struct {
	Count uint64  `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
}

func (h *hist) summary() latencyJSON {
	us := func(ns int64) float64 { return round3(float64(ns) / 1e3) }
	l := latencyJSON{Count: h.n, P50: us(h.quantile(0.5)), P90: us(h.quantile(0.9)),
		P99: us(h.quantile(0.99)), P999: us(h.quantile(0.999)), Max: us(h.max)}
	if h.n > 0 {
		l.Mean = round3(h.sum / float64(h.n) / 1e3)
	}
	return l
}

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// orderChecker follows every keyed message a group of consumers processes.
// A message is a duplicate if its (key, sequence) was seen before, and an
// order violation if it is new but a later sequence of its key was already
// processed (by any consumer). It also records which consumers saw each key.
type orderChecker struct {
	keys      []keyState
	consumers int
}

type keyState struct {
	mu         sync.Mutex
	max        uint32
	seen       []uint64 // bitset of sequence numbers
	unique     uint64
	dups       uint64
	violations uint64
	byConsumer []uint64 // bitset of consumer indexes
}

func newOrderChecker(keys, consumers int) *orderChecker {
	c := &orderChecker{keys: make([]keyState, keys), consumers: consumers}
	words := (consumers + 63) / 64
	for i := range c.keys {
		c.keys[i].byConsumer = make([]uint64, words)
	}
	return c
}

// observe records that consumer processed sequence seq (from 1) of key.
// It reports whether the message was a duplicate and whether it was out of
// order. Unknown keys are ignored (returns false, false).
func (c *orderChecker) observe(key uint32, seq uint32, consumer int) (dup, violation bool) {
	if int(key) >= len(c.keys) || seq == 0 {
		return false, false
	}
	k := &c.keys[key]
	k.mu.Lock()
	defer k.mu.Unlock()
	if consumer >= 0 && consumer < c.consumers {
		k.byConsumer[consumer/64] |= 1 << (consumer % 64)
	}
	w := int(seq / 64)
	if w >= len(k.seen) {
		n := max(2*len(k.seen), w+1)
		k.seen = append(k.seen, make([]uint64, n-len(k.seen))...)
	}
	bit := uint64(1) << (seq % 64)
	if k.seen[w]&bit != 0 {
		k.dups++
		return true, false
	}
	k.seen[w] |= bit
	k.unique++
	if seq < k.max {
		k.violations++
		violation = true
	} else {
		k.max = seq
	}
	return false, violation
}

type orderJSON struct {
	Keys                   int    `json:"keys"`
	KeysSeen               int    `json:"keys_seen"`
	Unique                 uint64 `json:"unique"`
	Duplicates             uint64 `json:"duplicates"`
	Missing                uint64 `json:"missing"`
	OrderViolations        uint64 `json:"order_violations"`
	KeysWithViolations     int    `json:"keys_with_violations"`
	KeysOnSeveralConsumers int    `json:"keys_on_several_consumers"`
	KeysPerConsumerMin     int    `json:"keys_per_consumer_min"`
	KeysPerConsumerMax     int    `json:"keys_per_consumer_max"`
}

// result summarises the checker; published is how many keyed messages were
// sent in all (missing = published - unique).
func (c *orderChecker) result(published uint64) orderJSON {
	r := orderJSON{Keys: len(c.keys)}
	perConsumer := make([]int, c.consumers)
	for i := range c.keys {
		k := &c.keys[i]
		k.mu.Lock()
		if k.unique > 0 {
			r.KeysSeen++
		}
		r.Unique += k.unique
		r.Duplicates += k.dups
		r.OrderViolations += k.violations
		if k.violations > 0 {
			r.KeysWithViolations++
		}
		on := 0
		for ci := 0; ci < c.consumers; ci++ {
			if k.byConsumer[ci/64]&(1<<(ci%64)) != 0 {
				on++
				perConsumer[ci]++
			}
		}
		if on > 1 {
			r.KeysOnSeveralConsumers++
		}
		k.mu.Unlock()
	}
	if published > r.Unique {
		r.Missing = published - r.Unique
	}
	if len(perConsumer) > 0 {
		r.KeysPerConsumerMin, r.KeysPerConsumerMax = perConsumer[0], perConsumer[0]
		for _, n := range perConsumer {
			r.KeysPerConsumerMin = min(r.KeysPerConsumerMin, n)
			r.KeysPerConsumerMax = max(r.KeysPerConsumerMax, n)
		}
	}
	return r
}
