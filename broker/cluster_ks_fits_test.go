package broker

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestClusterKeySharedPacketSizeOfARemoteMember: a message larger than the
// MQTT 5 Maximum Packet Size of a member on another node than the group's
// holder goes to a member that can take it, or waits for one, exactly as on
// one node: never to that member, never to the dead letters, each message
// to the member one node gives it to.
func TestClusterKeySharedPacketSizeOfARemoteMember(t *testing.T) {
	one := ksPacketSizeScenario(t, 1)
	cluster := ksPacketSizeScenario(t, 2)
	if !maps.Equal(one, cluster) {
		for s, who := range one {
			if cluster[s] != who {
				t.Errorf("%.12q: %s on one node, %s in cluster mode", s, who, cluster[s])
			}
		}
		t.Fatal("the members got other messages in cluster mode than on one node")
	}
}

// ksPacketSizeScenario runs the test on nodes nodes and returns which
// member got each message while both were connected.
func ksPacketSizeScenario(t *testing.T, nodes int) map[string]string {
	const maxPacket = 256
	p := startKSNodes(t, nodes, "", mqtttest.WorkerOptions{}, mqtttest.WorkerOptions{MaximumPacketSize: maxPacket})
	publish := p.publisher(mqtttest.WorkerOptions{})
	big := " " + strings.Repeat("x", 2*maxPacket)
	p.check = func(who string, m *mqtttest.WorkerMessage) {
		if who == "m2" && len(m.Payload) > maxPacket {
			t.Fatalf("m2 (Maximum Packet Size %d) got a %d-byte payload", maxPacket, len(m.Payload))
		}
	}

	// Both members connected; every key has large and small messages.
	const keys, perKey = 20, 6
	for i := range perKey {
		for k := range keys {
			pad := ""
			if (i+k)%2 == 0 {
				pad = big
			}
			publish("jobs/x", fmt.Sprintf("k%02d", k), pad, 1)
		}
	}
	p.receive(keys*perKey, "both members")
	byMember := p.byMember()
	t.Logf("%d node(s): deliveries %v", nodes, byMember)
	if byMember["m2"] == 0 {
		t.Fatalf("m2 got nothing: %v", byMember)
	}
	p.noDeadLetters("both members")

	// QoS 0 (routed, not logged): a message too large for m2 goes to m1.
	before := len(p.got)
	for k := range keys {
		publish("jobs/z", fmt.Sprintf("k%02d", k), big, 0)
	}
	p.receive(before+keys, "QoS 0")
	both := maps.Clone(p.got)

	// The only member that can take the large messages leaves: they wait
	// (m2's small ones on keys of their own keep flowing) and go to m1
	// when it is back.
	p.m1Leaves()
	before = len(p.got)
	for k := range keys {
		publish("jobs/y", fmt.Sprintf("k%02d", k), big, 1)
	}
	for k := range keys {
		publish("jobs/y", fmt.Sprintf("s%02d", k), "", 1)
	}
	p.receive(before+keys, "m2 alone")
	p.waitUnroutable(keys, "the large messages waiting for a member that can take them")
	p.noDeadLetters("while m1 was away")
	p.m1 = p.dial(p.bs[0], "m1", mqtttest.WorkerOptions{})
	p.receive(before+2*keys, "m1 back")
	p.noDeadLetters("m1 back")
	return both
}
