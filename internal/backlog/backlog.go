// Package backlog is the one rule for admitting a message into a Key-Shared
// group's backlog, applied by every backend: the segment log, the in-memory
// store, and the cluster (which hands it to JetStream as stream limits).
package backlog

// Limits bound a group's unresolved messages. A zero field means no bound.
type Limits struct {
	// MaxMessages bounds the unresolved messages.
	MaxMessages uint64
	// MaxBytes bounds the encoded bytes of the unresolved messages.
	MaxBytes uint64
	// DropOldest makes an append that reaches a limit resolve the oldest
	// unresolved messages (counted as dropped) until it fits; without it the
	// append is refused.
	DropOldest bool
}

// TooLarge reports whether a message of size bytes can never fit: it is
// refused under either policy.
func (l Limits) TooLarge(size uint64) bool { return l.MaxBytes > 0 && size > l.MaxBytes }

// Over reports whether a message of size bytes takes a group holding held
// unresolved messages of heldBytes past a limit: refuse it, or drop the
// oldest until it does not.
func (l Limits) Over(held, heldBytes, size uint64) bool {
	return (l.MaxMessages > 0 && held+1 > l.MaxMessages) || (l.MaxBytes > 0 && heldBytes+size > l.MaxBytes)
}
