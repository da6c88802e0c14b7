package connq

import (
	"bytes"
	"io"
	"testing"
	"time"
)

// TestCloseDoesNotWaitForAnUndecidedHold: a connection closed while an
// acknowledgement is held on a durable write that does not finish (a
// JetStream publish retried for seconds) finishes anyway: the held
// acknowledgement and what waits behind it are not sent (counted in
// AbandonedHolds), the closing DISCONNECT is. Before, the connection waited
// for the decision, and the listener's close, and the broker's stop, with it.
func TestCloseDoesNotWaitForAnUndecidedHold(t *testing.T) {
	a, b := tcpPair(t)
	stats := new(Stats)
	c := New(a, Limits{Hard: 1 << 20}, stats, nil)
	h := c.HoldAck(4, 7, true)
	c.Write([]byte{0x40, 2, 0, 7}) // PUBACK 7: held, never decided before the close
	c.Enqueue(pubN(7))             // waits behind it
	disconnect := []byte{0xE0, 1, 0x8B}
	c.Write(disconnect)
	c.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the closed connection still waits for its held acknowledgement")
	}
	got, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, disconnect) {
		t.Fatalf("peer read % x, want the DISCONNECT % x alone", got, disconnect)
	}
	if n := stats.AbandonedHolds.Load(); n != 1 {
		t.Fatalf("AbandonedHolds = %d, want 1", n)
	}
	h.Release() // the durable write ends after the connection: nothing happens
}

// TestCloseWaitsForAHoldDecidedInTime: a held acknowledgement decided soon
// after the close still goes, before the DISCONNECT.
func TestCloseWaitsForAHoldDecidedInTime(t *testing.T) {
	a, b := tcpPair(t)
	stats := new(Stats)
	c := New(a, Limits{Hard: 1 << 20}, stats, nil)
	h := c.HoldAck(4, 7, true)
	c.Write([]byte{0x40, 2, 0, 7})
	disconnect := []byte{0xE0, 1, 0x8B}
	c.Write(disconnect)
	c.Close()
	h.Release()
	got, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]byte{0x40, 2, 0, 7}, disconnect...); !bytes.Equal(got, want) {
		t.Fatalf("peer read % x, want % x", got, want)
	}
	<-c.Done()
	if n := stats.AbandonedHolds.Load(); n != 0 {
		t.Fatalf("AbandonedHolds = %d, want 0", n)
	}
}
