package broker

import (
	"testing"

	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/keyshared"
)

func TestMarkStates(t *testing.T) {
	msg := func(off uint64, key, payload string) keyshared.Message {
		return keyshared.Message{Offset: off, Key: key, Topic: "t/" + key, Payload: []byte(payload)}
	}
	msgs := []keyshared.Message{
		msg(1, "a", "a1"), msg(2, "b", "b1"), msg(3, "a", "a2"), msg(4, "a", "a3"), msg(5, "c", "c1"), msg(6, "b", "b2"),
	}
	held := map[string][]heldMessage{
		"a": {{member: "m1", topic: "t/a", payload: []byte("a2")}}, // a1 resolved, a2 in flight, a3 waits
		"b": {{member: "m2", topic: "t/b", payload: []byte("b9")}}, // held further on: b1, b2 resolved
	}
	for _, c := range []struct {
		members int
		want    []string
	}{
		{2, []string{"resolved", "resolved", "in-flight", "waiting", "", "resolved"}},
		{0, []string{"resolved", "resolved", "in-flight", "waiting", "waiting", "resolved"}},
	} {
		views := make([]adminapi.PendingMessageView, len(msgs))
		markStates(views, msgs, held, c.members)
		for i, v := range views {
			if v.State != c.want[i] {
				t.Errorf("%d members: offset %d state %q, want %q", c.members, msgs[i].Offset, v.State, c.want[i])
			}
		}
		if views[2].InFlightTo != "m1" {
			t.Errorf("in flight to %q", views[2].InFlightTo)
		}
	}
}
