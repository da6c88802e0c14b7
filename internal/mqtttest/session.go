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

// PublishSeq publishes the payloads "0" to "n-1" on topic at qos with every
// publish in flight at once (paho's asynchronous tokens), waits until all are
// acknowledged and returns how long that took.
func (c *V3) PublishSeq(t testing.TB, topic string, qos byte, n int) time.Duration {
	t.Helper()
	start := time.Now()
	toks := make([]mqtt3.Token, n)
	for i := range toks {
		toks[i] = c.Client.Publish(topic, qos, false, strconv.Itoa(i))
	}
	for i, tok := range toks {
		if !tok.WaitTimeout(Timeout) || tok.Error() != nil {
			t.Fatalf("publish %d on %s: %v", i, topic, tok.Error())
		}
	}
	return time.Since(start)
}
