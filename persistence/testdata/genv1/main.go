//go:build ignore

// genv1 writes the data directory testdata/v1.tar.gz holds: a keyline
// binary built from a commit that writes data format 1 (keyline.db without a
// format record, segments without headers; main at 1a343e8) is started on a
// fresh data dir and driven over MQTT, then stopped with SIGTERM.
//
//	git archive 1a343e8 | tar -x -C /tmp/v1 && cd /tmp/v1 && go build -o keyline-v1 .
//	go run ./persistence/testdata/genv1/main.go -keyline ./keyline-v1 -out /tmp/v1data
//	tar -C /tmp/v1data -czf persistence/testdata/v1.tar.gz .
//
// What it holds (TestOpensFormat1 and the integration test check it):
//   - groups workers/orders/# and audit/orders/#, both fed by 400 QoS 1
//     publishes to orders/<i%10> with key k<i%13> and payload "order <i> "
//     padded with dots to 150 bytes (one record per group and message);
//   - workers/orders/#: 150 messages acked, one dead-lettered (reason 0x99),
//     so 249 unresolved; audit/orders/#: all 400 unresolved;
//   - the persistent session offline-1 (MQTT 5, expiry one day) subscribed to
//     queued/# at QoS 1, away, with "queued 1".."queued 5" queued for it;
//   - the retained message config/site = "v1".
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

func main() {
	bin := flag.String("keyline", "./keyline-v1", "keyline binary writing format 1")
	out := flag.String("out", "", "data dir to create (must not exist)")
	flag.Parse()
	if _, err := os.Stat(*out); err == nil || *out == "" {
		log.Fatalf("-out %q must name a directory that does not exist", *out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(*bin, "--data-dir", *out, "--segment-size", "64KiB", "--tcp", addr, "--http", "", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	dial := func(id string, o mqtttest.WorkerOptions) *mqtttest.Worker {
		deadline := time.Now().Add(20 * time.Second)
		for {
			w, err := mqtttest.DialWorker(addr, id, o)
			if err == nil {
				return w
			}
			if time.Now().After(deadline) {
				log.Fatalf("dial %s: %v", id, err)
			}
			time.Sleep(50 * time.Millisecond) // waiting for the broker to listen
		}
	}
	must := func(code byte, err error) {
		if err != nil || code >= 0x80 {
			log.Fatalf("code 0x%02x, %v", code, err)
		}
	}
	for _, g := range []string{"$share/workers/orders/#", "$share/audit/orders/#"} {
		w := dial("make-"+strings.Split(g, "/")[1], mqtttest.WorkerOptions{CleanStart: true})
		must(w.Subscribe(g, 1))
		must(0, w.Disconnect())
	}
	off := dial("offline-1", mqtttest.WorkerOptions{CleanStart: true, SessionExpiry: 86400})
	must(off.Subscribe("queued/#", 1))
	must(0, off.Disconnect())

	pub := dial("pub", mqtttest.WorkerOptions{CleanStart: true})
	for i := 1; i <= 400; i++ {
		p := fmt.Sprintf("order %d ", i)
		p += strings.Repeat(".", 150-len(p))
		must(pub.Publish(fmt.Sprintf("orders/%d", i%10), []byte(p), 1, mqtttest.UserProperty{Key: "key", Value: fmt.Sprintf("k%d", i%13)}))
	}
	for i := 1; i <= 5; i++ {
		must(pub.Publish("queued/a", []byte(fmt.Sprintf("queued %d", i)), 1))
	}
	must(pub.PublishMessage(mqtttest.Outgoing{Topic: "config/site", Payload: []byte("v1"), QoS: 1, Retain: true}))
	must(0, pub.Disconnect())

	w := dial("w-orders", mqtttest.WorkerOptions{CleanStart: true, ReceiveMaximum: 1})
	must(w.Subscribe("$share/workers/orders/#", 1))
	for n := 0; n < 151; n++ {
		m := w.Next(10 * time.Second)
		if m == nil {
			log.Fatalf("no message %d", n)
		}
		if n == 0 {
			must(0, w.Nack(m, mqtttest.ReasonPayloadFormatInvalid))
		} else {
			must(0, w.Ack(m))
		}
	}
	must(0, w.Disconnect())
	// A deliberate wait: the dispatcher hands acks to the log on its
	// heartbeat (500 ms); two of them make every ack above part of the data.
	time.Sleep(1500 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		log.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		log.Fatalf("keyline: %v", err)
	}
	os.Remove(*out + "/segments/LOCK")
	fmt.Println("wrote", *out)
}
