package hooks

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

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

// ACL is the access rules in force, shared by the Auth hook and the hooks
// that check what a subscriber may read (the fan-out, Key-Shared), which the
// broker builds before Auth. It holds the auth policy in force, whose
// compiled rules it applies: a reload swaps the policy whole (Auth.Reload),
// so every check, whichever hook makes it, applies the new rules at once.
// It also holds the ACLs that connected clients' tokens carry (a JWT's ACL
// claim), tried before the rules, so that deliveries meet them too.
type ACL struct {
	// required: clients must authenticate (AuthPolicy.Required); without
	// it every topic is allowed. Fixed: turning auth on or off needs a
	// restart (ErrAuthToggle).
	required bool
	policy   atomic.Pointer[AuthPolicy]
	// tokens holds the ACL claim of each connected client that has one
	// (*mqtt.Client -> []aclFilter); ntokens counts them, so that checks
	// skip the lookup while no client has one.
	tokens  sync.Map
	ntokens atomic.Int64
}

// NewACL returns the access rules of p, the policy in force until a reload
// (NewACL(NewAuthPolicy(nil, nil, false)): no auth, every topic allowed).
func NewACL(p *AuthPolicy) *ACL {
	a := &ACL{required: p.Required}
	a.policy.Store(p)
	return a
}

// Configured reports whether the rules apply (without that CanRead is
// always true, and the broker gives the hooks no read check at all).
func (a *ACL) Configured() bool { return a.required }

// setToken records the ACL claim of cl's token (none: nothing is kept).
func (a *ACL) setToken(cl *mqtt.Client, own []aclFilter) {
	if len(own) == 0 {
		return
	}
	if _, had := a.tokens.Swap(cl, own); !had {
		a.ntokens.Add(1)
	}
}

// forget drops cl's token ACL (it disconnected).
func (a *ACL) forget(cl *mqtt.Client) {
	if a.ntokens.Load() == 0 {
		return
	}
	if _, had := a.tokens.LoadAndDelete(cl); had {
		a.ntokens.Add(-1)
	}
}

// CanRead reports whether cl may receive a message published on topic (or
// subscribe to topic): the broker's own clients and, without auth,
// everyone may.
func (a *ACL) CanRead(cl *mqtt.Client, topic string) bool {
	return cl.Net.Inline || !a.required || a.allows(cl, topic, false)
}

// allows applies the rules (and cl's token ACL) to one access of topic by
// cl. A shared subscription $share/<share>/<filter> must be allowed both as
// that string and as <filter>.
func (a *ACL) allows(cl *mqtt.Client, topic string, write bool) bool {
	var own []aclFilter
	if a.ntokens.Load() > 0 {
		if v, ok := a.tokens.Load(cl); ok {
			own = v.([]aclFilter)
		}
	}
	rules := a.policy.Load().acl
	user := string(cl.Properties.Username)
	ok := rules.decideWith(own, cl.ID, user, cl.Net.Remote, topic, write)
	if !write {
		if n, shared, err := share.ParseSubscription(topic); shared && err == nil {
			ok = ok && rules.decideWith(own, cl.ID, user, cl.Net.Remote, n.Filter, false)
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
	return a.decideWith(nil, client, username, remote, topic, write)
}

// decideWith is decide with the client's own filters (a token's ACL claim)
// tried first, as a user's own acl map is.
func (a *acl) decideWith(own []aclFilter, client, username, remote, topic string, write bool) bool {
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
	if allow, decided := pick(own); decided {
		return allow
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
