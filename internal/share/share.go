// Package share names Key-Shared groups. A group is the share name and the
// topic filter of an MQTT shared subscription `$share/<share>/<filter>`; its
// name is "<share>/<filter>". This is the one parser of that syntax: the
// Key-Shared hook, the stores, the admin API, the CLI and the console all go
// through Name.
//
// The "$share" prefix is matched without regard to case, as mochi's topic
// index does (so every subscription mochi treats as shared is a group here).
// A share name is one topic level of at most MaxShareLen bytes: non-empty,
// without '/', '+' or '#', not starting with '$' (reserved: it would make
// "$share/<share>/<filter>" and "<share>/<filter>" ambiguous), valid UTF-8
// without U+0000. The filter is a valid MQTT topic filter. The whole name is
// at most MaxNameLen bytes.
//
// The broker's own groups (a bridge's outbound queue) have share names that
// start with InternalPrefix. Parse and ParseInput accept them (they name
// stored groups); ParseSubscription, which reads what clients send, refuses
// them like every other share name starting with '$', so no client can join,
// create or name one.
package share

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Prefix starts every shared subscription (matched case-insensitively).
const Prefix = "$share/"

// MaxShareLen is the longest share name accepted, in bytes.
const MaxShareLen = 256

// MaxNameLen is the longest group name accepted, in bytes (the longest key
// the data file takes).
const MaxNameLen = 32 << 10

// ErrInvalid is wrapped by every error of this package; the wrapping error
// says what is wrong.
var ErrInvalid = errors.New("invalid group name")

// InternalPrefix starts the share names of the broker's own groups.
const InternalPrefix = "$keyline."

// Name is a Key-Shared group. The zero Name is not valid.
type Name struct {
	Share  string
	Filter string
}

// String returns "<share>/<filter>".
func (n Name) String() string { return n.Share + "/" + n.Filter }

// Internal reports whether n is one of the broker's own groups.
func (n Name) Internal() bool { return strings.HasPrefix(n.Share, InternalPrefix) }

// Subscription returns the subscription filter "$share/<share>/<filter>".
func (n Name) Subscription() string { return Prefix + n.String() }

// IsShared reports whether filter starts with "$share/" in any case.
func IsShared(filter string) bool {
	return len(filter) >= len(Prefix) && strings.EqualFold(filter[:len(Prefix)], Prefix)
}

// ParseSubscription parses a SUBSCRIBE or UNSUBSCRIBE filter. shared reports
// whether it is a shared subscription at all; err whether it is a malformed one.
func ParseSubscription(filter string) (n Name, shared bool, err error) {
	if !IsShared(filter) {
		return Name{}, false, nil
	}
	n, err = parse(filter[len(Prefix):], filter)
	if err == nil && n.Internal() {
		return Name{}, true, fmt.Errorf("%w: share name %s starts with '$'", ErrInvalid, quote(n.Share))
	}
	return n, true, err
}

// Parse parses a group name "<share>/<filter>".
func Parse(name string) (Name, error) { return parse(name, name) }

// ParseInput parses a group name as a person types it: "<share>/<filter>" or
// the whole subscription "$share/<share>/<filter>".
func ParseInput(s string) (Name, error) {
	if IsShared(s) {
		return parse(s[len(Prefix):], s)
	}
	return parse(s, s)
}

func parse(rest, orig string) (Name, error) {
	share, filter, ok := strings.Cut(rest, "/")
	if !ok {
		return Name{}, fmt.Errorf("%w: %s: want %q", ErrInvalid, quote(orig), "<share>/<filter>")
	}
	n := Name{Share: share, Filter: filter}
	if err := n.Validate(); err != nil {
		return Name{}, err
	}
	return n, nil
}

// Validate reports what is wrong with n, if anything.
func (n Name) Validate() error {
	s := n.Share
	switch {
	case s == "":
		return fmt.Errorf("%w: empty share name", ErrInvalid)
	case len(s) > MaxShareLen:
		return fmt.Errorf("%w: share name of %d bytes (at most %d)", ErrInvalid, len(s), MaxShareLen)
	case strings.ContainsAny(s, "/+#"):
		return fmt.Errorf("%w: share name %s contains '/', '+' or '#'", ErrInvalid, quote(s))
	case s[0] == '$' && !n.Internal():
		return fmt.Errorf("%w: share name %s starts with '$'", ErrInvalid, quote(s))
	case !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: share name %s is not valid UTF-8 without U+0000", ErrInvalid, quote(s))
	case len(s)+1+len(n.Filter) > MaxNameLen:
		return fmt.Errorf("%w: name of %d bytes (at most %d)", ErrInvalid, len(s)+1+len(n.Filter), MaxNameLen)
	}
	if err := ValidFilter(n.Filter); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

// ValidFilter reports what is wrong with an MQTT topic filter, if anything:
// non-empty, valid UTF-8 without U+0000, '#' only as the whole last level,
// '+' only as a whole level.
func ValidFilter(f string) error {
	switch {
	case f == "":
		return errors.New("empty topic filter")
	case len(f) > 65535:
		return fmt.Errorf("topic filter of %d bytes (at most 65535)", len(f))
	case !utf8.ValidString(f) || strings.IndexByte(f, 0) >= 0:
		return fmt.Errorf("topic filter %s is not valid UTF-8 without U+0000", quote(f))
	}
	for level := range strings.SplitSeq(f, "/") {
		if strings.ContainsAny(level, "+#") && len(level) > 1 {
			return fmt.Errorf("topic filter %s: '+' and '#' must fill a whole level", quote(f))
		}
	}
	if i := strings.IndexByte(f, '#'); i >= 0 && i != len(f)-1 {
		return fmt.Errorf("topic filter %s: '#' must be the last level", quote(f))
	}
	return nil
}

// quote quotes s for an error message, shortened when it is long.
func quote(s string) string {
	const max = 80
	if len(s) > max {
		return fmt.Sprintf("%q... (%d bytes)", s[:max], len(s))
	}
	return fmt.Sprintf("%q", s)
}
