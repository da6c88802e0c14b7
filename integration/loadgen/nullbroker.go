package main

// nullbroker is a calibration target, not an MQTT broker: it accepts
// CONNECT, SUBSCRIBE (exact topic names only) and QoS 0 PUBLISH, and forwards
// each publisher's read batch to every subscriber of the topic by reference,
// one writev per subscriber wakeup. Driving it shows how fast the load
// generator itself can go on this machine: its ceiling, to set beside the
// rates it measures on real brokers.

import (
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/keyline-mq/keyline/internal/mqttwire"
)

type nullBroker struct {
	mu     sync.RWMutex
	topics map[string][]*nullConn
}

type nullConn struct {
	c     net.Conn
	mu    sync.Mutex
	q     [][]byte
	bytes int
	wake  chan struct{}
	dead  bool
}

// maxQueued bounds a subscriber's queue; past it batches are dropped (the
// load generator's gate keeps queues far below this).
const maxQueued = 64 << 20

func cmdNullBroker(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen nullbroker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:0", "listen address (loopback)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(stderr, "loadgen nullbroker:", err)
		return 1
	}
	fmt.Fprintf(stdout, "nullbroker listening on %s\n", ln.Addr())
	nb := &nullBroker{topics: map[string][]*nullConn{}}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		ln.Close()
	}()
	nb.serve(ln)
	return 0
}

func (nb *nullBroker) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go nb.handle(c)
	}
}

func (nb *nullBroker) handle(c net.Conn) {
	nc := &nullConn{c: c, wake: make(chan struct{}, 1)}
	defer func() {
		nc.mu.Lock()
		nc.dead = true
		nc.mu.Unlock()
		notify(nc.wake)
		c.Close()
		nb.unsubscribe(nc)
	}()
	go nc.writer()
	fr := mqttwire.NewReader(c, 64<<10)
	var proto byte = 4
	var batch []byte
	var batchTopic string
	flushBatch := func() {
		if len(batch) == 0 {
			return
		}
		nb.mu.RLock()
		subs := nb.topics[batchTopic]
		nb.mu.RUnlock()
		for _, s := range subs {
			s.enqueue(batch)
		}
		batch = nil // shared by reference from now on
	}
	for {
		p, err := fr.Next()
		if err != nil {
			return
		}
		switch p.Type {
		case mqttwire.TypeConnect:
			if len(p.Body) >= 7 {
				proto = p.Body[6] // after the protocol name "MQTT"
			}
			ack := []byte{mqttwire.TypeConnack << 4, 2, 0, 0}
			if proto == mqttwire.Version5 {
				ack = []byte{mqttwire.TypeConnack << 4, 3, 0, 0, 0}
			}
			nc.enqueue(ack)
		case mqttwire.TypeSubscribe:
			if len(p.Body) < 2 {
				return
			}
			id := binary.BigEndian.Uint16(p.Body)
			b := p.Body[2:]
			if proto == mqttwire.Version5 {
				pl, n, err := mqttwire.ReadVarint(b)
				if err != nil || len(b) < n+pl {
					return
				}
				b = b[n+pl:]
			}
			if len(b) < 2 {
				return
			}
			fl := int(binary.BigEndian.Uint16(b))
			if len(b) < 2+fl {
				return
			}
			nb.subscribe(string(b[2:2+fl]), nc)
			ack := []byte{mqttwire.TypeSuback << 4, 3, byte(id >> 8), byte(id), 0}
			if proto == mqttwire.Version5 {
				ack = []byte{mqttwire.TypeSuback << 4, 4, byte(id >> 8), byte(id), 0, 0}
			}
			nc.enqueue(ack)
		case mqttwire.TypePublish:
			m, err := mqttwire.DecodePublish(proto, p)
			if err != nil {
				return
			}
			if m.QoS != 0 {
				return // QoS 0 only
			}
			if string(m.Topic) != batchTopic {
				flushBatch()
				batchTopic = string(m.Topic)
			}
			batch = mqttwire.AppendHeader(batch, p.Type, p.Flags, len(p.Body))
			batch = append(batch, p.Body...)
		case mqttwire.TypePingreq:
			nc.enqueue([]byte{mqttwire.TypePingresp << 4, 0})
		case mqttwire.TypeDisconnect:
			return
		}
		if !fr.Buffered() {
			flushBatch()
		}
	}
}

func (nb *nullBroker) subscribe(topic string, nc *nullConn) {
	nb.mu.Lock()
	defer nb.mu.Unlock()
	old := nb.topics[topic]
	subs := make([]*nullConn, len(old), len(old)+1) // copy on write: readers hold the old slice
	copy(subs, old)
	nb.topics[topic] = append(subs, nc)
}

func (nb *nullBroker) unsubscribe(nc *nullConn) {
	nb.mu.Lock()
	defer nb.mu.Unlock()
	for t, subs := range nb.topics {
		var keep []*nullConn
		for _, s := range subs {
			if s != nc {
				keep = append(keep, s)
			}
		}
		nb.topics[t] = keep
	}
}

func (nc *nullConn) enqueue(b []byte) {
	nc.mu.Lock()
	if nc.dead || nc.bytes+len(b) > maxQueued {
		nc.mu.Unlock()
		return
	}
	nc.q = append(nc.q, b)
	nc.bytes += len(b)
	nc.mu.Unlock()
	notify(nc.wake)
}

func (nc *nullConn) writer() {
	var q [][]byte
	for range nc.wake {
		nc.mu.Lock()
		if nc.dead {
			nc.mu.Unlock()
			return
		}
		q, nc.q = nc.q, q[:0]
		nc.bytes = 0
		nc.mu.Unlock()
		if len(q) == 0 {
			continue
		}
		bufs := net.Buffers(q)
		if _, err := bufs.WriteTo(nc.c); err != nil {
			nc.c.Close()
			return
		}
		clear(q)
	}
}
