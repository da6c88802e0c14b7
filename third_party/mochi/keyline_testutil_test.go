package mqtt

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// closeWhenWritten closes w once cl's write loop has written every packet
// queued for it (its outbound count is back at 0: the loop lowers it after
// the write returns, which on a net.Pipe is once the reader has the bytes).
// It replaces v2.7.9's fixed sleeps before the close, which lost the packet
// when the write loop had not run yet (seen on a loaded machine).
func closeWhenWritten(t *testing.T, cl *Client, w net.Conn) {
	deadline := time.Now().Add(10 * time.Second)
	for atomic.LoadInt32(&cl.State.outboundQty) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond) // polling a counter no event announces, bounded by the deadline
	}
	if atomic.LoadInt32(&cl.State.outboundQty) > 0 {
		t.Error("the write loop did not write the queued packets in 10 s")
	}
	_ = w.Close()
}
