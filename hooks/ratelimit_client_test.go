package hooks

import (
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// TestClientRatesWindow: a client's figures are what it sent in the last
// whole second, at injected times.
func TestClientRatesWindow(t *testing.T) {
	h := NewRateLimits(RateSettings{})
	cl := &mqtt.Client{}
	c := &clientState{}
	h.clients.Store(cl, c)
	t0 := time.Unix(1000, 0)
	if r := h.Rates(&mqtt.Client{}, t0); r != (ClientRates{}) {
		t.Errorf("a client that never published: %+v", r)
	}
	for i := range 7 { // 7 messages of 10 bytes in second 1000
		c.count(t0.Add(time.Duration(i)*100*time.Millisecond), 10, 0)
	}
	c.count(t0.Add(900*time.Millisecond), 30, 250*time.Millisecond)
	for _, tc := range []struct {
		at          time.Duration
		msgs, bytes float64
	}{
		{500 * time.Millisecond, 0, 0}, // second 1000 is not over: the one before had nothing
		{1500 * time.Millisecond, 8, 100},
		{2500 * time.Millisecond, 0, 0}, // nothing since: the figures fall to 0
	} {
		r := h.Rates(cl, t0.Add(tc.at))
		if r.MessagesPerSec != tc.msgs || r.BytesPerSec != tc.bytes || r.Throttled != 250*time.Millisecond {
			t.Errorf("at +%v: %+v, want %v msg/s, %v B/s, throttled 250ms", tc.at, r, tc.msgs, tc.bytes)
		}
	}
	c.count(t0.Add(1100*time.Millisecond), 5, 0) // second 1001: second 1000 becomes the previous
	if r := h.Rates(cl, t0.Add(1200*time.Millisecond)); r.MessagesPerSec != 8 || r.BytesPerSec != 100 {
		t.Errorf("in second 1001: %+v, want second 1000's 8 msg/s, 100 B/s", r)
	}
	c.count(t0.Add(3100*time.Millisecond), 5, 0) // second 1003 after a silent 1002
	if r := h.Rates(cl, t0.Add(3200*time.Millisecond)); r.MessagesPerSec != 0 {
		t.Errorf("after a silent second: %+v, want 0 msg/s", r)
	}
	h.OnDisconnect(cl, nil, false)
	if r := h.Rates(cl, t0.Add(3200*time.Millisecond)); r != (ClientRates{}) {
		t.Errorf("after the disconnect: %+v", r)
	}
}
