package outbox

import "math/bits"

// idTable maps the packet ids of live messages to their sequence numbers.
// It is an open-addressing table with linear probing and a multiplicative
// hash, which scatters the consecutive ids a session hands out (on the id
// itself they would form one long run that every deletion walks). Deletion
// shifts later entries back (no tombstones), so the constant churn of a busy
// session costs no more than a quiet one. An empty table holds no memory.
type idTable struct {
	keys  []uint16 // 0: an empty slot (0 is never a packet id)
	vals  []uint64
	n     int
	shift uint8 // 32 - log2(len(keys))
}

func (t *idTable) mask() int { return len(t.keys) - 1 }

// home is id's preferred slot (Fibonacci hashing).
func (t *idTable) home(id uint16) int { return int((uint32(id) * 2654435769) >> t.shift) }

// get returns the seq of id.
func (t *idTable) get(id uint16) (uint64, bool) {
	if t.n == 0 {
		return 0, false
	}
	m := t.mask()
	for i := t.home(id); ; i = (i + 1) & m {
		switch t.keys[i] {
		case id:
			return t.vals[i], true
		case 0:
			return 0, false
		}
	}
}

// put sets the seq of id (not 0).
func (t *idTable) put(id uint16, seq uint64) {
	if 2*(t.n+1) > len(t.keys) {
		t.resize(max(16, 2*len(t.keys)))
	}
	m := t.mask()
	for i := t.home(id); ; i = (i + 1) & m {
		switch t.keys[i] {
		case id:
			t.vals[i] = seq
			return
		case 0:
			t.keys[i], t.vals[i] = id, seq
			t.n++
			return
		}
	}
}

// del removes id.
func (t *idTable) del(id uint16) {
	if t.n == 0 {
		return
	}
	m := t.mask()
	i := t.home(id)
	for t.keys[i] != id {
		if t.keys[i] == 0 {
			return
		}
		i = (i + 1) & m
	}
	t.n--
	if t.n == 0 && len(t.keys) > 64 {
		*t = idTable{} // idle: let the memory go
		return
	}
	// Shift back each later entry of the run that may move into the hole:
	// one whose home slot is not cyclically within (hole, its slot].
	for j := (i + 1) & m; t.keys[j] != 0; j = (j + 1) & m {
		k := t.home(t.keys[j])
		stays := (i < k && k <= j) || (j < i && (i < k || k <= j))
		if !stays {
			t.keys[i], t.vals[i] = t.keys[j], t.vals[j]
			i = j
		}
	}
	t.keys[i], t.vals[i] = 0, 0
}

func (t *idTable) resize(n int) {
	old := *t
	*t = idTable{keys: make([]uint16, n), vals: make([]uint64, n), shift: uint8(32 - bits.Len(uint(n-1)))}
	for i, k := range old.keys {
		if k != 0 {
			t.put(k, old.vals[i])
		}
	}
}

// each calls fn with every id.
func (t *idTable) each(fn func(id uint16)) {
	for _, k := range t.keys {
		if k != 0 {
			fn(k)
		}
	}
}
