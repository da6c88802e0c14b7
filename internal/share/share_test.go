package share

import (
	"errors"
	"strings"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
)

func TestParse(t *testing.T) {
	good := []struct{ in, share, filter string }{
		{"workers/orders/#", "workers", "orders/#"},
		{"w/+", "w", "+"},
		{"w/a/+/c", "w", "a/+/c"},
		{"w//", "w", "/"},
	}
	for _, tc := range good {
		n, err := Parse(tc.in)
		if err != nil || n.Share != tc.share || n.Filter != tc.filter || n.String() != tc.in {
			t.Errorf("Parse(%q) = %+v, %v", tc.in, n, err)
		}
		m, shared, err := ParseSubscription(n.Subscription())
		if err != nil || !shared || m != n {
			t.Errorf("ParseSubscription(%q) = %+v, %v, %v", n.Subscription(), m, shared, err)
		}
		if m, err := ParseInput("$SHARE/" + tc.in); err != nil || m != n {
			t.Errorf("ParseInput($SHARE/%s) = %+v, %v", tc.in, m, err)
		}
		if m, err := ParseInput(tc.in); err != nil || m != n {
			t.Errorf("ParseInput(%s) = %+v, %v", tc.in, m, err)
		}
	}
	bad := map[string]string{
		"":                "want",
		"workers":         "want",
		"/orders":         "empty share name",
		"work+ers/orders": "contains '/', '+' or '#'",
		"w#/orders":       "contains",
		"$share/orders":   "starts with '$'",
		"w/":              "empty topic filter",
		"w/a/#/b":         "'#' must be the last level",
		"w/a+":            "whole level",
		"w/a\x00":         "U+0000",
		strings.Repeat("s", MaxShareLen+1) + "/x": "share name of 257 bytes",
		"w/" + strings.Repeat("x", MaxNameLen):    "at most",
		"\xff/x":                                  "UTF-8",
	}
	for in, want := range bad {
		_, err := Parse(in)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an ErrInvalid containing %q", in, err, want)
		}
	}
	if _, shared, err := ParseSubscription("orders/#"); shared || err != nil {
		t.Errorf("a plain filter is not shared: %v %v", shared, err)
	}
	if _, shared, err := ParseSubscription("$share/w"); !shared || err == nil {
		t.Errorf("$share/w is a malformed shared subscription: %v %v", shared, err)
	}
}

func TestInternalNames(t *testing.T) {
	n, err := Parse(InternalPrefix + "bridge.cloud/sensors/#")
	if err != nil || !n.Internal() || n.Filter != "sensors/#" {
		t.Fatalf("Parse of an internal name = %+v, %v", n, err)
	}
	if m, err := ParseInput(n.String()); err != nil || m != n {
		t.Fatalf("ParseInput(%s) = %+v, %v", n, m, err)
	}
	for _, s := range []string{n.Subscription(), "$SHARE/" + n.String()} {
		if _, shared, err := ParseSubscription(s); !shared || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "starts with '$'") {
			t.Errorf("a client's %s: shared %v, %v; want refused", s, shared, err)
		}
	}
	if n, err := Parse("orders/#"); err != nil || n.Internal() {
		t.Fatalf("orders/# internal: %+v %v", n, err)
	}
}

// FuzzName: every valid name survives String/Parse and Subscription/
// ParseSubscription, and a filter is shared here exactly when mochi's topic
// index treats it as shared.
func FuzzName(f *testing.F) {
	for _, s := range []string{"$share/g/a/#", "$SHARE/g/+", "$share//x", "$share/g/", "g/a/b", "$sharex/a", "$share/$g/a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, shared, err := ParseSubscription(s)
		if shared != mqtt.IsSharedFilter(s) && len(s) >= len(Prefix) {
			// mochi looks at the first level only ("$share" in any case).
			first, _, _ := strings.Cut(s, "/")
			if strings.EqualFold(first, "$share") != shared {
				t.Fatalf("ParseSubscription(%q): shared %v, mochi %v", s, shared, mqtt.IsSharedFilter(s))
			}
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("ParseSubscription(%q) error %v does not wrap ErrInvalid", s, err)
			}
			return
		}
		if !shared {
			return
		}
		if n.Internal() {
			t.Fatalf("%q: a client may name the internal group %s", s, n)
		}
		if !mqtt.IsValidFilter(n.Filter, false) {
			t.Fatalf("%q: filter %q accepted here, refused by mochi", s, n.Filter)
		}
		m, err := Parse(n.String())
		if err != nil || m != n {
			t.Fatalf("Parse(%q) = %+v, %v; want %+v", n.String(), m, err, n)
		}
		if m, err := ParseInput(n.Subscription()); err != nil || m != n {
			t.Fatalf("ParseInput(%q) = %+v, %v", n.Subscription(), m, err)
		}
	})
}
