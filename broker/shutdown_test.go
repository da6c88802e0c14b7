package broker

import (
	"context"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestShutdownSendsClientsAway: a broker that stops tells MQTT 5 clients why
// (DISCONNECT 0x8B), or, with server-reference, where to go (0x9C and the
// Server Reference), so a rolling restart moves them without guessing.
func TestShutdownSendsClientsAway(t *testing.T) {
	for _, tc := range []struct {
		name, ref string
		code      byte
	}{
		{"no reference", "", 0x8B},
		{"server reference", "node-b.example:1883", 0x9C},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.ServerReference = tc.ref
			b := startBroker(t, cfg)
			got := make(chan *paho.Disconnect, 1)
			c := paho.NewClient(paho.ClientConfig{
				Conn:               mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil),
				OnServerDisconnect: func(d *paho.Disconnect) { got <- d },
			})
			ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
			defer cancel()
			if _, err := c.Connect(ctx, &paho.Connect{ClientID: "leaver", CleanStart: true, KeepAlive: 30}); err != nil {
				t.Fatal(err)
			}
			if err := b.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case d := <-got:
				ref := ""
				if d.Properties != nil {
					ref = d.Properties.ServerReference
				}
				if d.ReasonCode != tc.code || ref != tc.ref {
					t.Fatalf("DISCONNECT %#x reference %q, want %#x %q", d.ReasonCode, ref, tc.code, tc.ref)
				}
			case <-time.After(mqtttest.Timeout):
				t.Fatal("no DISCONNECT from a broker shutting down")
			}
			<-c.Done()
		})
	}
}
