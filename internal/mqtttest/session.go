package mqtttest

import (
	"strconv"
	"testing"
	"time"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"
)

// AwayV3 leaves an MQTT 3.1.1 persistent session (clean session false) of
// clientID subscribed to filter at QoS 1, its client disconnected.
func AwayV3(t testing.TB, url, clientID, filter string) {
	t.Helper()
	c := ConnectV3(t, url, clientID, false, nil)
	if qos := c.Subscribe(t, filter, 1); qos != 1 {
		t.Fatalf("%s: SUBACK %#x for %s", clientID, qos, filter)
	}
	c.Disconnect(0)
}

// PublishSeq publishes the payloads "0" to "n-1" on topic at qos, at most
// PublishWindow of them in flight at once (paho's asynchronous tokens), waits
// until all are acknowledged and returns how long that took.
//
// The window is what a device keeps (MQTT 3.1.1 has no Receive Maximum to
// bound it): with all n in flight, paho writes them at once and then sends
// nothing for its keep-alive (30 s), so its PINGREQ waits in the broker's
// socket behind every publish not yet read, and paho drops the connection if
// those take longer than its ping timeout (10 s) to process, as a cluster
// node storing each QoS 1 publish in JetStream did under load at message 784
// of 1,000 (TestClusterResumedSessionKeepsOrder: "connection lost").
func (c *V3) PublishSeq(t testing.TB, topic string, qos byte, n int) time.Duration {
	t.Helper()
	start := time.Now()
	toks := make([]mqtt3.Token, n)
	wait := func(i int) {
		if tok := toks[i]; !tok.WaitTimeout(Timeout) || tok.Error() != nil {
			t.Fatalf("publish %d on %s: %v", i, topic, tok.Error())
		}
	}
	for i := range toks {
		if i >= PublishWindow {
			wait(i - PublishWindow)
		}
		toks[i] = c.Client.Publish(topic, qos, false, strconv.Itoa(i))
	}
	for i := max(0, n-PublishWindow); i < n; i++ {
		wait(i)
	}
	return time.Since(start)
}

// PublishWindow is how many publishes PublishSeq keeps in flight.
const PublishWindow = 100
