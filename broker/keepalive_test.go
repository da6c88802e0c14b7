package broker

import (
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/mqttwire"
)

// TestMaxKeepAlive: with max-keep-alive, an MQTT 5 client (paho.golang) that
// asks for a longer keep alive or for none is told the maximum in CONNACK's
// Server Keep Alive [MQTT-3.2.2-21], one that asks for less keeps its own, and
// a client that then stays silent is disconnected after 1.5 times it.
func TestMaxKeepAlive(t *testing.T) {
	cfg := testConfig(t)
	cfg.MaxKeepAlive = 60 * time.Second
	b := startBroker(t, cfg)
	for _, tc := range []struct {
		asked uint16
		want  uint16 // 0: no Server Keep Alive
	}{{120, 60}, {0, 60}, {60, 0}, {30, 0}} {
		c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil), &paho.Connect{ClientID: "ka", CleanStart: true, KeepAlive: tc.asked})
		got := uint16(0)
		if p := c.Connack.Properties; p != nil && p.ServerKeepAlive != nil {
			got = *p.ServerKeepAlive
		}
		if got != tc.want {
			t.Errorf("keep alive %d: Server Keep Alive %d, want %d", tc.asked, got, tc.want)
		}
		c.Close()
	}

	cfg = testConfig(t)
	cfg.MaxKeepAlive = time.Second
	b = startBroker(t, cfg)
	conn := mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil)
	connect := mqtttest.Frame(mqttwire.TypeConnect, 0, mqtttest.Str("MQTT"), []byte{mqttwire.Version5, 0x02}, mqtttest.U16(0), mqtttest.Props(), mqtttest.Str("silent"))
	if _, err := conn.Write(connect); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if !mqtttest.IsClosed(conn) { // the CONNACK, then nothing until the close
		t.Fatalf("a silent client told keep alive 1 s is still connected after %v", mqtttest.Timeout)
	}
	t.Logf("closed after %v", time.Since(start))
}
