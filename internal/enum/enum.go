// Package enum gives small named-value types (policies, modes) one list of
// names each and the methods that let them parse themselves from flags
// (pflag.Value) and YAML (encoding.TextUnmarshaler).
//
// A type keeps its names in one Names value, index i naming the value i+1:
// the zero value of every such type means "not set" (an override that leaves
// the setting alone, or the documented default).
package enum

import (
	"fmt"
	"strings"
)

// Names lists the names of an enum type's values 1..len(names), in order.
type Names []string

// Parse returns the value named s. The error reads `<what> "<s>" is not one
// of <names>` and matches sentinel with errors.Is.
func (n Names) Parse(what, s string, sentinel error) (uint8, error) {
	for i, name := range n {
		if name == s {
			return uint8(i + 1), nil
		}
	}
	return 0, &parseError{fmt.Sprintf("%s %q is not one of %s", what, s, n.String()), sentinel}
}

type parseError struct {
	msg      string
	sentinel error
}

func (e *parseError) Error() string { return e.msg }
func (e *parseError) Unwrap() error { return e.sentinel }

// Name returns the name of value v, "" for the zero value and a
// placeholder for a value out of range.
func (n Names) Name(v uint8) string {
	switch {
	case v == 0:
		return ""
	case int(v) <= len(n):
		return n[v-1]
	}
	return fmt.Sprintf("(%d)", v)
}

// String lists the names: "a, b or c".
func (n Names) String() string {
	switch len(n) {
	case 0:
		return ""
	case 1:
		return n[0]
	}
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}
