package keyshared

import (
	"slices"
	"strconv"
	"strings"
)

// VirtualNodes is the number of points each member owns on the hash ring.
const VirtualNodes = 100

// ringMember is one member as the ring sees it.
type ringMember struct {
	id      string
	filters filterSet
	// canRead, when set, reports whether the member may read a topic.
	canRead func(topic string) bool
	// fits, when set, reports whether the member can take a message.
	fits func(m *Message) bool
}

// eligible reports whether msg may go to the member: its key filters accept
// the key, it may read the topic, and it can take the message.
func (m *ringMember) eligible(msg *Message) bool {
	return m.filters.match(msg.Key) && (m.canRead == nil || m.canRead(msg.Topic)) && (m.fits == nil || m.fits(msg))
}

// vnode is one point on the ring: a 32-bit position and the index of the
// member owning it in ring.members.
type vnode struct {
	hash uint32
	idx  int32
}

// ring is an immutable consistent-hash ring: VirtualNodes points per member at
// fmix32(FNV-1a("{member}-{i}")), sorted clockwise. A key lands on the first
// point at or after fmix32(FNV-1a(key)), wrapping at the end.
//
// A ring is never modified after buildRing returns, so the non-reliable
// Router may share one between goroutines.
type ring struct {
	vnodes []vnode
	// members is sorted by id, so the ring (and every answer it gives) does
	// not depend on the order in which members joined.
	members []ringMember
	// restricted counts members that may refuse a message (key filters or read access).
	// When it is zero every member is eligible for every key and pick takes
	// the direct path.
	restricted int
	// index[b] is the first point whose hash's top bits are >= b, so that a
	// lookup searches only the few points of its bucket (a plain binary search
	// over the whole ring costs a dozen unpredictable branches).
	index []int32
	shift uint
}

// buildRing builds the ring for members; ids must be unique.
func buildRing(members []ringMember) *ring {
	r := &ring{members: slices.Clone(members)}
	slices.SortFunc(r.members, func(a, b ringMember) int { return strings.Compare(a.id, b.id) })
	// Sort points as packed hash<<32|idx words: ordered by hash, ties broken by
	// member id (members are sorted, so by idx), keeping the ring free of
	// insertion order; sorting plain integers is several times faster than
	// sorting structs with a comparison function.
	packed := make([]uint64, 0, len(members)*VirtualNodes)
	var buf []byte
	for i, m := range r.members {
		if m.canRead != nil || m.fits != nil || len(m.filters) > 0 {
			r.restricted++
		}
		for v := range VirtualNodes {
			buf = append(buf[:0], m.id...)
			buf = append(buf, '-')
			buf = strconv.AppendInt(buf, int64(v), 10)
			packed = append(packed, uint64(fmix32(fnv1a(buf)))<<32|uint64(i))
		}
	}
	slices.Sort(packed)
	r.vnodes = make([]vnode, len(packed))
	for i, p := range packed {
		r.vnodes[i] = vnode{hash: uint32(p >> 32), idx: int32(uint32(p))}
	}
	bits := uint(1)
	for 1<<bits < 2*len(r.vnodes) && bits < 16 {
		bits++
	}
	r.shift = 32 - bits
	r.index = make([]int32, 1<<bits+1)
	j := 0
	for b := range r.index {
		for j < len(r.vnodes) && uint64(r.vnodes[j].hash)>>r.shift < uint64(b) {
			j++
		}
		r.index[b] = int32(j)
	}
	return r
}

// pickMessage returns the index of the member msg goes to: the first
// eligible one (ringMember.eligible) clockwise from its key's point, or -1.
func (r *ring) pickMessage(msg *Message) int {
	return r.pickFunc(msg.Key, func(i int) bool { return r.members[i].eligible(msg) })
}

// pickFunc is pick with a say in eligibility: ok (nil: the member's key
// filters decide) reports whether member i may take the message.
//
// With restricted members present the ring is projected onto the eligible
// members by walking clockwise from the key's point to the first point of an
// eligible member: exactly the answer a ring built from the eligible members
// alone would give, without building it. Each member is asked at most once
// per pick, however many of its points the walk passes.
func (r *ring) pickFunc(key string, ok func(i int) bool) int {
	n := len(r.vnodes)
	if n == 0 {
		return -1
	}
	h := hashKey(key)
	// Binary search for the first point >= h, within h's bucket.
	b := h >> r.shift
	lo, hi := int(r.index[b]), int(r.index[b+1])
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r.vnodes[mid].hash < h {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == n {
		lo = 0
	}
	if r.restricted == 0 {
		return int(r.vnodes[lo].idx)
	}
	// seen marks members already refused (a bitset; on the stack for up to
	// 256 members).
	var small [4]uint64
	seen := small[:]
	if words := (len(r.members) + 63) / 64; words > len(small) {
		seen = make([]uint64, words)
	}
	left := len(r.members)
	for j := 0; j < n && left > 0; j++ {
		i := lo + j
		if i >= n {
			i -= n
		}
		idx := r.vnodes[i].idx
		if seen[idx/64]&(1<<(idx%64)) != 0 {
			continue
		}
		m := &r.members[idx]
		if ok != nil && ok(int(idx)) || ok == nil && m.filters.match(key) {
			return int(idx)
		}
		seen[idx/64] |= 1 << (idx % 64)
		left--
	}
	return -1
}

// hashKey is the ring position of a routing key.
func hashKey(key string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return fmix32(h)
}

// fnv1a is the 32-bit FNV-1a hash of b.
func fnv1a(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		h ^= uint32(c)
		h *= 16777619
	}
	return h
}

// fmix32 is murmur3's 32-bit finalizer; it spreads FNV's weak low bits over
// the whole word.
func fmix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}
