package hooks

import (
	"bufio"
	"net"
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/outbox"
)

// A session's outbox is made when it is first needed: a session that is
// sent nothing has none, and the first QoS 1 message, made while a
// connection is attached, goes out on that connection; a discarded session
// refuses what comes after.
func TestFanoutSessionOutboxMadeOnFirstUse(t *testing.T) {
	defer goleak.VerifyNone(t)
	server := mqtt.New(&mqtt.Options{InlineClient: false})
	r := newSessionRegistry(&outbox.Config{Max: 10})
	cl := server.NewClient(nil, "t", "dev1", false)
	s := r.ensure(cl)
	if s.outbox() != nil {
		t.Fatal("a session sent nothing has an outbox")
	}

	broker, client := net.Pipe()
	defer client.Close()
	q := connq.New(broker, connq.Limits{Hard: 1 << 20}, nil, nil)
	defer q.Close()
	s.attach(&sessConn{q: q, version: 4, inflight: cl.State.Inflight}, 0, false)
	if s.outbox() != nil {
		t.Fatal("attaching a connection made an outbox")
	}

	p, err := encodeFrame(packets.Packet{TopicName: "a/b", Payload: []byte("x")}, 4, false, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if added, _ := s.need(r.cfg).AddDurable(p, 0, 0, 0, nil); !added {
		t.Fatal("the first message was refused")
	}
	if s.outbox() == nil {
		t.Fatal("no outbox after the first message")
	}
	var fh packets.FixedHeader
	br := bufio.NewReader(client)
	b, err := br.ReadByte()
	if err != nil {
		t.Fatal(err)
	}
	if err := fh.Decode(b); err != nil || fh.Type != packets.Publish || fh.Qos != 1 {
		t.Fatalf("first frame on the connection: %x (%v), want a QoS 1 PUBLISH", b, err)
	}
	if held, inflight := s.outbox().Len(); held != 1 || inflight != 1 {
		t.Fatalf("outbox holds %d, %d in flight; want 1, 1", held, inflight)
	}
	go func() { _, _ = br.Discard(1 << 20) }() // the rest of the frame, and whatever Close flushes
	s.detach(q)

	// A discarded session (its client gone for good) takes nothing, even
	// where no outbox was made before.
	s2 := r.ensure(server.NewClient(nil, "t", "dev2", false))
	r.drop("dev2", s2)
	if added, _ := s2.need(r.cfg).AddDurable(p, 0, 0, 0, nil); added {
		t.Fatal("a discarded session took a message")
	}
	if s2.outbox() != nil {
		t.Fatal("a discarded session kept an outbox")
	}
}
