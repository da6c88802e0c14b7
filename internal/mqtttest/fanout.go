package mqtttest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt3 "github.com/eclipse/paho.mqtt.golang"
)

// FanoutTarget is a broker measured by MeasureFanout: subscribers connect
// to Subs in turn, publishers to Pub.
type FanoutTarget struct {
	Subs []string
	Pub  string
	// Received, when set, counts the cross-node messages its nodes received.
	Received func() uint64
}

// FanoutRun is one measured fan-out.
type FanoutRun struct {
	Deliveries float64 // messages delivered to subscribers per second
	CPU        float64 // microseconds of this process's CPU per delivery (brokers in this process, NATS servers and clients)
	Copies     float64 // cross-node messages received per publish, summed over nodes
	Interested int     // nodes other than the publisher's with subscribers
}

// Shape of a measured fan-out: publishers, and QoS 1/2 publishes each keeps
// in flight (QoS 0 publishes keep at most window messages ahead of the
// slowest subscriber instead).
const (
	fanoutPublishers = 4
	fanoutInflight   = 64
	fanoutWindow     = 2000
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func connectBench(b testing.TB, addr, id string, onMsg func(mqtt3.Message)) mqtt3.Client {
	b.Helper()
	o := mqtt3.NewClientOptions().AddBroker("tcp://" + addr).SetClientID(id).SetProtocolVersion(4).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectRetry(false).SetOrderMatters(true).
		SetConnectTimeout(Timeout).SetWriteTimeout(Timeout)
	if onMsg != nil {
		o.SetDefaultPublishHandler(func(_ mqtt3.Client, m mqtt3.Message) { onMsg(m) })
	}
	c := mqtt3.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(Timeout) || tok.Error() != nil {
		b.Fatalf("connect %s to %s: %v", id, addr, tok.Error())
	}
	return c
}

// MeasureFanout publishes n messages at qos (MQTT 3.1.1, 64-byte payloads)
// from four publishers on tg.Pub to subs subscribers spread over tg.Subs,
// and waits until every subscriber has every message.
func MeasureFanout(b testing.TB, tg FanoutTarget, subs, n int, qos byte) FanoutRun {
	b.Helper()
	prefix := fmt.Sprintf("bench/%d", time.Now().UnixNano())
	run, warm := prefix+"/run", prefix+"/warm"
	counts := make([]atomic.Int64, subs)
	warmed := make([]atomic.Bool, subs)
	var clients []mqtt3.Client
	defer func() {
		for _, c := range clients {
			c.Disconnect(0)
		}
	}()
	for i := range subs {
		c := connectBench(b, tg.Subs[i%len(tg.Subs)], fmt.Sprintf("bsub-%d-%s", i, prefix), func(m mqtt3.Message) {
			if m.Topic() == run {
				counts[i].Add(1)
			} else {
				warmed[i].Store(true)
			}
		})
		clients = append(clients, c)
		if tok := c.Subscribe(prefix+"/#", qos, nil); !tok.WaitTimeout(Timeout) || tok.Error() != nil {
			b.Fatalf("subscribe: %v", tok.Error())
		}
	}
	pubs := make([]mqtt3.Client, fanoutPublishers)
	for i := range pubs {
		pubs[i] = connectBench(b, tg.Pub, fmt.Sprintf("bpub-%d-%s", i, prefix), nil)
		clients = append(clients, pubs[i])
	}
	slowest := func() int64 {
		m := counts[0].Load()
		for i := range counts {
			m = min(m, counts[i].Load())
		}
		return m
	}
	// Until every subscriber hears: interest reaches the other NATS servers
	// (and their MQTT consumers) asynchronously after the SUBACK.
	everyone := func() bool {
		for i := range warmed {
			if !warmed[i].Load() {
				return false
			}
		}
		return true
	}
	Eventually(b, 20*time.Second, "every subscriber to hear", func() bool {
		pubs[0].Publish(warm, 1, false, "warm").WaitTimeout(Timeout) // paced by the poll
		return everyone()
	})
	var before uint64
	if tg.Received != nil {
		before = tg.Received()
	}
	payload := make([]byte, 64)
	cpu0, start := cpuTime(), time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(pubs))
	for p, pub := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var toks []mqtt3.Token
			for i := p; i < n; i += len(pubs) {
				if qos == 0 && int64(i)-slowest() > fanoutWindow &&
					!Within(time.Minute, func() bool { return int64(i)-slowest() <= fanoutWindow }) {
					errs <- fmt.Errorf("subscribers %d messages behind for a minute", int64(i)-slowest())
					return
				}
				toks = append(toks, pub.Publish(run, qos, false, payload))
				if len(toks) > fanoutInflight {
					if !toks[0].WaitTimeout(30*time.Second) || toks[0].Error() != nil {
						errs <- fmt.Errorf("publish: %v", toks[0].Error())
						return
					}
					toks = toks[1:]
				}
			}
			for _, tok := range toks {
				if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
					errs <- fmt.Errorf("publish: %v", tok.Error())
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	if !Within(time.Minute, func() bool { return slowest() >= int64(n) }) {
		b.Fatalf("slowest subscriber has %d of %d messages", slowest(), n)
	}
	elapsed, cpu := time.Since(start), cpuTime()-cpu0
	r := FanoutRun{
		Deliveries: float64(n*subs) / elapsed.Seconds(),
		CPU:        float64(cpu.Microseconds()) / float64(n*subs),
		Interested: min(len(tg.Subs), subs) - 1,
	}
	if tg.Received != nil {
		r.Copies = float64(tg.Received()-before) / float64(n)
	}
	return r
}
