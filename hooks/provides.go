package hooks

// methodSet is a set of mochi hook methods (mqtt.OnConnect, ...). mochi asks
// every hook whether it provides a method before each call of it, several
// times per packet, so the answer is one bit test rather than a search.
type methodSet [4]uint64

func methods(ms ...byte) methodSet {
	var s methodSet
	for _, m := range ms {
		s[m>>6] |= 1 << (m & 63)
	}
	return s
}

func (s *methodSet) has(m byte) bool { return s[m>>6]&(1<<(m&63)) != 0 }
