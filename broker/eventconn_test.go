package broker

import (
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestConnectionEndedBeforeItsRegistrationIsRecorded: a connection whose
// whole life passes between its registration with the poller and
// serveEvents recording it (the accepting goroutine descheduled under load)
// leaves no registration behind; one left behind held the closed client,
// and everything it referenced, until the broker stopped.
func TestConnectionEndedBeforeItsRegistrationIsRecorded(t *testing.T) {
	b := startBroker(t, testConfig(t))
	if b.poller == nil {
		t.Skip("no readiness events on this system")
	}
	var l *listener
	for _, ln := range b.mqttLns {
		if ln.proto == "tcp" {
			l = ln
		}
	}
	base := b.poller.Stats().Conns.Load()
	release := make(chan struct{})
	hold := func() { <-release }
	l.afterPollerAdd.Store(&hold)
	defer func() {
		l.afterPollerAdd.Store(nil)
		select {
		case <-release:
		default:
			close(release)
		}
	}()

	c := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil), &paho.Connect{ClientID: "brief", CleanStart: true, KeepAlive: 30})
	c.Subscribe(t, paho.SubscribeOptions{Topic: "brief/#", QoS: 1})
	c.Close()
	waitFor(t, mqtttest.Timeout, "brief to be forgotten", func() bool { _, ok := b.server.Clients.Get("brief"); return !ok })
	waitFor(t, mqtttest.Timeout, "its registration to be removed while serveEvents waits", func() bool {
		return b.poller.Stats().Conns.Load() == base
	})
	l.afterPollerAdd.Store(nil)
	close(release)
	waitFor(t, mqtttest.Timeout, "no registration left once serveEvents went on", func() bool {
		return b.poller.Stats().Conns.Load() == base
	})
}
