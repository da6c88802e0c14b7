package cluster

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/keyline-mq/keyline/internal/wire"
)

// offsets is a set of log offsets kept as sorted, disjoint, non-adjacent
// ranges: the acks above a group's cursor arrive almost in order, so the
// set stays small.
type offsets struct{ r [][2]uint64 }

func (s *offsets) find(x uint64) int {
	return sort.Search(len(s.r), func(i int) bool { return s.r[i][1] >= x })
}

func (s *offsets) contains(x uint64) bool {
	i := s.find(x)
	return i < len(s.r) && s.r[i][0] <= x
}

// add adds a..b (a <= b).
func (s *offsets) add(a, b uint64) {
	i := s.find(a - min(a, 1)) // first range that ends at or after a-1
	j := i
	for j < len(s.r) && s.r[j][0] <= b+1 {
		a, b = min(a, s.r[j][0]), max(b, s.r[j][1])
		j++
	}
	s.r = slices.Replace(s.r, i, j, [2]uint64{a, b})
}

// removeThrough drops every offset <= c.
func (s *offsets) removeThrough(c uint64) {
	i := s.find(c + 1)
	s.r = slices.Delete(s.r, 0, i)
	if len(s.r) > 0 && s.r[0][0] <= c {
		s.r[0][0] = c + 1
	}
}

func (s *offsets) count() uint64 {
	var n uint64
	for _, r := range s.r {
		n += r[1] - r[0] + 1
	}
	return n
}

// groupState is what a group's holder replicates in s.<group hash>, fenced
// by its lease: the contiguous cursor and the acks above it, so a new holder
// redelivers only what was not resolved.
type groupState struct {
	epoch    uint64 // the writer's lease epoch
	cursor   uint64 // every offset <= cursor is resolved
	resolved offsets
	dropped  uint64 // unresolved messages the drop-oldest backlog policy removed
	// dlqSeq: every dead letter at or below this KL_DLQ sequence is counted
	// in cursor/resolved; a new holder reads the ones after it.
	dlqSeq   uint64
	lastSeen time.Time // when the group last had members
	members  int       // members at the time of the write
}

const stateVersion = 1

// encode: version, uvarints epoch, cursor, dropped, dlqSeq, varint last
// seen (unix nanoseconds), uvarint members, uvarint count of ranges, then
// each range as uvarint gap from the previous range's end (the cursor for
// the first) and uvarint length - 1.
func (st *groupState) encode() []byte {
	b := make([]byte, 0, 64+8*len(st.resolved.r))
	b = append(b, stateVersion)
	for _, v := range [...]uint64{st.epoch, st.cursor, st.dropped, st.dlqSeq} {
		b = binary.AppendUvarint(b, v)
	}
	var seen int64
	if !st.lastSeen.IsZero() {
		seen = st.lastSeen.UnixNano()
	}
	b = binary.AppendVarint(b, seen)
	b = binary.AppendUvarint(b, uint64(max(st.members, 0)))
	b = binary.AppendUvarint(b, uint64(len(st.resolved.r)))
	prev := st.cursor
	for _, r := range st.resolved.r {
		b = binary.AppendUvarint(b, r[0]-prev)
		b = binary.AppendUvarint(b, r[1]-r[0])
		prev = r[1]
	}
	return b
}

func decodeGroupState(buf []byte) (groupState, error) {
	var st groupState
	if len(buf) == 0 || buf[0] != stateVersion {
		return st, fmt.Errorf("%w: group state version", errWire)
	}
	d := wire.NewDecoder(buf[1:], errWire)
	st.epoch, st.cursor, st.dropped, st.dlqSeq = d.Uvarint(), d.Uvarint(), d.Uvarint(), d.Uvarint()
	if v := d.Varint(); v != 0 {
		st.lastSeen = time.Unix(0, v)
	}
	st.members = int(min(d.Uvarint(), 1<<31))
	prev := st.cursor
	for range d.Count() {
		first := prev + d.Uvarint()
		last := first + d.Uvarint()
		if d.Err() != nil || first <= prev || last < first {
			d.Fail("resolved range")
			break
		}
		st.resolved.r = append(st.resolved.r, [2]uint64{first, last})
		prev = last
	}
	return st, d.Done()
}
