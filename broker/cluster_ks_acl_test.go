package broker

import (
	"fmt"
	"strings"
	"testing"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// ksACLConfig: alice may read every topic, bob all of jobs/ but jobs/secret/.
const ksACLConfig = `
auth:
  auth:
    - {username: alice, password: apw, allow: true}
    - {username: bob, password: bpw, allow: true}
    - {username: pub, password: ppw, allow: true}
  acl:
    - username: bob
      filters:
        "jobs/secret/#": 0
        "jobs/#": 1
`

// TestClusterKeySharedReadAccessOfARemoteMember: a message that a member on
// another node than the group's holder may not read goes to a member that
// may, or waits for one, as on one node: never to that member, never to the
// dead letters.
func TestClusterKeySharedReadAccessOfARemoteMember(t *testing.T) {
	p := startKSPair(t, ksACLConfig, mqtttest.WorkerOptions{Username: "alice", Password: "apw"}, mqtttest.WorkerOptions{Username: "bob", Password: "bpw"})
	publishQoS := p.publisher(mqtttest.WorkerOptions{Username: "pub", Password: "ppw"})
	publish := func(topic, key string) { t.Helper(); publishQoS(topic, key, "", 1) }
	bobReadsSecret := false
	p.check = func(who string, m *mqtttest.WorkerMessage) {
		if who == "m2" && !bobReadsSecret && strings.HasPrefix(m.Topic, "jobs/secret/") {
			t.Fatalf("m2 (bob, may not read jobs/secret/#) got %s %q", m.Topic, m.Payload)
		}
	}

	// Phase 1: both members connected; every key has messages each may
	// read and messages only m1 may.
	const keys, perKey = 20, 6
	for i := range perKey {
		for k := range keys {
			topic := "jobs/public/x"
			if (i+k)%2 == 0 {
				topic = "jobs/secret/x"
			}
			publish(topic, fmt.Sprintf("k%02d", k))
		}
	}
	p.receive(keys*perKey, "both members")
	byMember := p.byMember()
	t.Logf("deliveries: %v", byMember)
	if byMember["m2"] == 0 {
		t.Fatalf("m2 got nothing: %v", byMember)
	}
	p.noDeadLetters("both members")

	// QoS 0 (routed, not logged): a message m2 may not read goes to m1.
	before0 := len(p.got)
	for k := range keys {
		publishQoS("jobs/secret/z", fmt.Sprintf("k%02d", k), "", 0)
	}
	p.receive(before0+keys, "QoS 0")

	// Phase 2: the only member that may read jobs/secret/ leaves; its
	// messages wait (m2's keep flowing) and go to it when it is back.
	p.m1Leaves()
	before := len(p.got)
	for k := range keys {
		publish("jobs/secret/y", fmt.Sprintf("k%02d", k))
	}
	for k := range keys {
		publish("jobs/public/y", fmt.Sprintf("p%02d", k)) // keys of their own: no secret message ahead of them
	}
	p.receive(before+keys, "m2 alone")
	p.waitUnroutable(keys, "the secret messages waiting for a member that may read them")
	p.noDeadLetters("while m1 was away")
	p.m1 = p.dial(p.bs[0], "m1", mqtttest.WorkerOptions{Username: "alice", Password: "apw"})
	p.receive(before+2*keys, "m1 back")
	p.noDeadLetters("m1 back")

	// Phase 3: a reload lets bob read jobs/secret/ too: the topics the
	// holder learnt he may not read are his again.
	p.m1Leaves()
	for i, b := range p.bs {
		var fresh Config
		if err := DecodeConfig([]byte(strings.ReplaceAll(ksACLConfig, `"jobs/secret/#": 0`, `"jobs/secret/#": 1`)), &fresh); err != nil {
			t.Fatal(err)
		}
		c := p.cfgs[i]
		c.Auth = fresh.Auth
		b.SetReloadSource(func() (Config, error) { return c, nil })
		if res, err := b.Reload(); err != nil || len(res.NeedRestart) != 0 {
			t.Fatalf("reload: %+v %v", res, err)
		}
	}
	bobReadsSecret = true
	before = len(p.got)
	for k := range keys {
		publish("jobs/secret/y", fmt.Sprintf("k%02d", k))
	}
	p.receive(before+keys, "after the reload")
	p.noDeadLetters("after the reload")
}
