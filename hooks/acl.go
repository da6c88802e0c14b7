package hooks

import (
	"cmp"
	"slices"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"

	"github.com/keyline-mq/keyline/internal/share"
)

// acl is a mochi auth ledger's ACL compiled for deterministic decisions.
// mochi keeps a rule's filters (and each user's) in Go maps and takes the
// first that matches in map order, so a user with {"#": 3, "secret/#": 0}
// could read secret/plans most of the time. Here filters are tried most
// specific first (see moreSpecific), and a deny wins over an allow of equal
// specificity.
//
// Decision for a client, a topic and an access (read or write):
//  1. the user's own ACL (users: <name>: acl:), if any of its filters
//     matches: the most specific one decides;
//  2. else the ACL rules in file order whose client, username and remote
//     match: a rule without filters allows; otherwise its most specific
//     matching filter decides; a rule none of whose filters match is skipped;
//  3. else the topic is allowed, except the broker's own topics, $dlq/...
//     and $SYS/...: dead letters carry other clients' payloads and $SYS the
//     broker's figures, so reading them needs a filter that names them (a
//     rule without filters does not grant them either).
//
// As in MQTT's own matching, a filter that starts with a wildcard says
// nothing about topics that start with '$' ($dlq/..., $SYS/..., and the full
// string of a shared subscription, $share/<share>/<filter>): a rule names
// them explicitly or leaves them alone, so a deny-all "#": 0 at the end of the
// rules does not forbid every group's share name.
type acl struct {
	users map[string][]aclFilter
	rules []aclRule
}

type aclRule struct {
	client, username, remote auth.RString
	filters                  []aclFilter // sorted: most specific first
	any                      bool        // no filters: the rule allows everything
}

type aclFilter struct {
	filter string
	access auth.Access
	// dollar: the filter starts with '$' (it may match '$' topics).
	dollar bool
}

// ACL is a ledger's access rules compiled once, shared by the Auth hook and
// the hooks that check what a subscriber may read (the fan-out, Key-Shared),
// which the broker builds before Auth.
type ACL struct {
	ledger *auth.Ledger // nil: no auth configured, every topic allowed
	acl    *acl
}

// NewACL compiles ledger's ACL (nil: no auth, every topic allowed).
func NewACL(ledger *auth.Ledger) *ACL { return &ACL{ledger: ledger, acl: compileACL(ledger)} }

// Configured reports whether there is a ledger (without one CanRead is
// always true, and the broker gives the hooks no read check at all).
func (a *ACL) Configured() bool { return a.ledger != nil }

// CanRead reports whether cl may receive a message published on topic (or
// subscribe to topic): the broker's own clients and, without a ledger,
// everyone may.
func (a *ACL) CanRead(cl *mqtt.Client, topic string) bool {
	return cl.Net.Inline || a.ledger == nil || a.allows(cl, topic, false)
}

// allows applies the ledger's ACL to one access of topic by cl. A shared
// subscription $share/<share>/<filter> must be allowed both as that string
// and as <filter>.
func (a *ACL) allows(cl *mqtt.Client, topic string, write bool) bool {
	ok := a.acl.decide(cl.ID, string(cl.Properties.Username), cl.Net.Remote, topic, write)
	if !write {
		if n, shared, err := share.ParseSubscription(topic); shared && err == nil {
			ok = ok && a.acl.decide(cl.ID, string(cl.Properties.Username), cl.Net.Remote, n.Filter, false)
		}
	}
	return ok
}

func compileACL(l *auth.Ledger) *acl {
	a := &acl{users: map[string][]aclFilter{}}
	if l == nil {
		return a
	}
	for name, u := range l.Users {
		if len(u.ACL) > 0 {
			a.users[name] = sortFilters(u.ACL)
		}
	}
	for _, r := range l.ACL {
		a.rules = append(a.rules, aclRule{client: r.Client, username: r.Username, remote: r.Remote,
			filters: sortFilters(r.Filters), any: len(r.Filters) == 0})
	}
	return a
}

func sortFilters(fs auth.Filters) []aclFilter {
	out := make([]aclFilter, 0, len(fs))
	for f, access := range fs {
		out = append(out, aclFilter{filter: string(f), access: access, dollar: strings.HasPrefix(string(f), "$")})
	}
	slices.SortFunc(out, func(x, y aclFilter) int {
		if c := moreSpecific(x.filter, y.filter); c != 0 {
			return c
		}
		// Equally specific: a deny first, then by name (determinism).
		if c := cmp.Compare(x.access, y.access); c != 0 {
			return c
		}
		return strings.Compare(x.filter, y.filter)
	})
	return out
}

// moreSpecific orders topic filters: negative when a is more specific than
// b. More literal levels first; then without '#' before with it; then more
// levels; 0 when none of these tells them apart.
func moreSpecific(a, b string) int {
	la, ha, pa := filterShape(a)
	lb, hb, pb := filterShape(b)
	if c := cmp.Compare(lb, la); c != 0 {
		return c
	}
	if ha != hb {
		if ha {
			return 1
		}
		return -1
	}
	return cmp.Compare(pb, pa)
}

func filterShape(f string) (literals int, hash bool, plus int) {
	for level := range strings.SplitSeq(f, "/") {
		switch level {
		case "#":
			hash = true
		case "+":
			plus++
		default:
			literals++
		}
	}
	return
}

func grants(access auth.Access, write bool) bool {
	if write {
		return access == auth.WriteOnly || access == auth.ReadWrite
	}
	return access == auth.ReadOnly || access == auth.ReadWrite
}

// brokerTopic reports whether topic is one of the broker's own that no
// default grants: $dlq/... and $SYS/... (any case, as mochi matches $SYS).
func brokerTopic(topic string) bool {
	first, _, _ := strings.Cut(topic, "/")
	return first == "$dlq" || strings.EqualFold(first, "$SYS")
}

// decide applies the ACL to one access of topic (a topic name, or a filter
// for a subscription).
func (a *acl) decide(client, username, remote, topic string, write bool) bool {
	dollar := strings.HasPrefix(topic, "$")
	dlqTopic := brokerTopic(topic)
	pick := func(fs []aclFilter) (bool, bool) {
		for _, f := range fs {
			if dollar && !f.dollar {
				continue // a wildcard does not reach '$' topics
			}
			if auth.RString(f.filter).FilterMatches(topic) {
				return grants(f.access, write), true
			}
		}
		return false, false
	}
	if fs, ok := a.users[username]; ok {
		if allow, decided := pick(fs); decided {
			return allow
		}
	}
	for _, r := range a.rules {
		if !r.client.Matches(client) || !r.username.Matches(username) || !r.remote.Matches(remote) {
			continue
		}
		if r.any {
			if dlqTopic {
				continue
			}
			return true
		}
		if allow, decided := pick(r.filters); decided {
			return allow
		}
	}
	return !dlqTopic
}
