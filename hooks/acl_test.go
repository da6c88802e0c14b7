package hooks

import (
	"testing"

	"github.com/mochi-mqtt/server/v2/hooks/auth"
)

func TestACLOrderIsDefined(t *testing.T) {
	l := &auth.Ledger{
		Users: auth.Users{
			"greedy": {Password: "x", ACL: auth.Filters{"#": auth.ReadWrite, "secret/#": auth.Deny, "secret/public/+": auth.ReadOnly}},
			"tie":    {Password: "x", ACL: auth.Filters{"a/+": auth.ReadWrite, "+/b": auth.Deny}},
		},
		ACL: auth.ACLRules{
			{Username: "ops", Filters: auth.Filters{"$dlq/#": auth.ReadOnly, "#": auth.ReadOnly}},
			{Username: "open"},
			{Filters: auth.Filters{"$SYS/#": auth.ReadOnly, "#": auth.Deny}},
		},
	}
	a := compileACL(l)
	for _, tc := range []struct {
		user, topic string
		write, want bool
	}{
		{"greedy", "secret/plans", false, false}, // the deny is more specific than #
		{"greedy", "secret/public/x", false, true},
		{"greedy", "secret/public/x", true, false},
		{"greedy", "news", true, true},
		{"tie", "a/b", false, false}, // equally specific: the deny wins
		{"tie", "a/c", true, true},
		{"ops", "$dlq/billing/x", false, true},
		{"ops", "$dlq/billing/x", true, false},
		{"open", "$dlq/billing/x", false, false}, // a rule without filters does not grant dead letters
		{"open", "anything", true, true},
		{"greedy", "$dlq/billing/x", false, false},    // "#" does not reach $ topics
		{"nobody", "$SYS/broker/uptime", false, true}, // named by the last rule
		{"nobody", "sensors/1", false, false},
		{"nobody", "$share/g/orders/#", false, true}, // "#": 0 says nothing of share names
	} {
		for range 20 { // map order must not matter
			if got := a.decide("c", tc.user, "1.2.3.4", tc.topic, tc.write); got != tc.want {
				t.Fatalf("%s %s write=%v: %v, want %v", tc.user, tc.topic, tc.write, got, tc.want)
			}
		}
	}
}

// TestBrokerTopicsNeedAFilterThatNamesThem: with a ledger, $dlq/... and
// $SYS/... are readable only through a filter that names them: neither a
// rule without filters nor the default grants them ($SYS was readable by
// everyone).
func TestBrokerTopicsNeedAFilterThatNamesThem(t *testing.T) {
	a := compileACL(&auth.Ledger{ACL: auth.ACLRules{{Username: "open"}, {Username: "ops", Filters: auth.Filters{"$SYS/#": auth.ReadOnly}}}})
	for _, tc := range []struct {
		user, topic string
		want        bool
	}{
		{"open", "$SYS/broker/uptime", false},
		{"nobody", "$SYS/broker/uptime", false},
		{"nobody", "$sys/broker/uptime", false},
		{"ops", "$SYS/broker/uptime", true},
		{"open", "$dlq/g/x", false},
		{"nobody", "sensors/1", true},
		{"nobody", "$other/x", true},
	} {
		if got := a.decide("c", tc.user, "1.2.3.4", tc.topic, false); got != tc.want {
			t.Errorf("%s reading %s: %v, want %v", tc.user, tc.topic, got, tc.want)
		}
	}
}

func TestMoreSpecific(t *testing.T) {
	order := []string{"a/b/c", "a/b/+", "a/b/#", "a/+/+", "a/+", "a/#", "+/#", "#"}
	for i := 0; i+1 < len(order); i++ {
		if moreSpecific(order[i], order[i+1]) >= 0 {
			t.Errorf("%s should come before %s", order[i], order[i+1])
		}
	}
}
