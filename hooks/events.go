package hooks

// events is a set of mochi hook events (mqtt.OnConnect and the rest), the
// answer a hook's Provides gives. mochi asks every hook before every call
// of every packet, so the answer is one bit test.
type events uint64

// eventSet returns the set of the events given; mochi's events are below 64.
func eventSet(es ...byte) events {
	var s events
	for _, e := range es {
		if e >= 64 {
			panic("hooks: mochi event out of range")
		}
		s |= 1 << e
	}
	return s
}

// has reports whether e is in the set.
func (s events) has(e byte) bool { return e < 64 && s&(1<<e) != 0 }
