// Command device-fleet simulates a fleet of MQTT 3.1.1 devices: each device is
// its own connection publishing telemetry to telemetry/<device-id> at a fixed
// rate, with a per-device sequence number in every payload:
//
//	{"device":"device-0007","seq":42,"ts":1700000000123,"temp":21.37}
//
// MQTT 3.1.1 has no user properties, so the routing key of a Key-Shared group
// is the topic: every device is one key, and a keyed worker
// (examples/keyed-worker) checks that its sequence numbers arrive in order.
//
//	go run ./examples/device-fleet --devices 50 --rate 2 --duration 1m
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/spf13/pflag"
)

type options struct {
	broker     string
	devices    int
	rate       float64
	duration   time.Duration
	count      int
	qos        int
	topic      string
	idPrefix   string
	username   string
	password   string
	report     time.Duration
	connectDur time.Duration
}

func parseFlags(args []string, errOut io.Writer) (options, error) {
	o := options{}
	fs := pflag.NewFlagSet("device-fleet", pflag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.StringVar(&o.broker, "broker", "tcp://127.0.0.1:1883", "broker address, tcp://host:port (or host:port)")
	fs.IntVar(&o.devices, "devices", 10, "number of devices, one MQTT connection each")
	fs.Float64Var(&o.rate, "rate", 1, "messages per second per device")
	fs.DurationVar(&o.duration, "duration", 30*time.Second, "how long to publish; 0: until interrupted (or --count)")
	fs.IntVar(&o.count, "count", 0, "messages per device, then stop; 0: no limit")
	fs.IntVar(&o.qos, "qos", 1, "QoS of the publishes (Key-Shared keeps order and retries only for QoS >= 1)")
	fs.StringVar(&o.topic, "topic", "telemetry", "topic prefix: devices publish to <topic>/<device-id>")
	fs.StringVar(&o.idPrefix, "id-prefix", "device-", "client ids and device ids are <id-prefix>0001, ...")
	fs.StringVar(&o.username, "username", "", "user name (auth ledger)")
	fs.StringVar(&o.password, "password", "", "password (auth ledger)")
	fs.DurationVar(&o.report, "report", 5*time.Second, "print progress this often; 0: only at exit")
	fs.DurationVar(&o.connectDur, "connect-timeout", 10*time.Second, "bound on each connect and publish acknowledgement")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.devices < 1:
		return o, errors.New("--devices must be at least 1")
	case o.rate <= 0:
		return o, errors.New("--rate must be positive")
	case o.qos < 0 || o.qos > 2:
		return o, fmt.Errorf("--qos %d: want 0, 1 or 2", o.qos)
	case o.duration < 0 || o.count < 0:
		return o, errors.New("--duration and --count must not be negative")
	case o.topic == "" || strings.ContainsAny(o.topic, "+#"):
		return o, fmt.Errorf("--topic %q: want a topic prefix without wildcards", o.topic)
	}
	if !strings.Contains(o.broker, "://") {
		o.broker = "tcp://" + o.broker
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "device-fleet: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := run(ctx, o, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "device-fleet: %v\n", err)
		os.Exit(1)
	}
	if s.Failed > 0 {
		os.Exit(3)
	}
}

// Summary counts what the fleet did.
type Summary struct {
	Devices   int           // devices that connected
	Published int64         // publishes completed (acknowledged for QoS >= 1)
	Failed    int64         // publishes not acknowledged, devices cut off
	Elapsed   time.Duration // from the first connect to the last publish
}

func (s Summary) String() string {
	rate := 0.0
	if s.Elapsed > 0 {
		rate = float64(s.Published) / s.Elapsed.Seconds()
	}
	return fmt.Sprintf("devices=%d published=%d failed=%d in %v (%.0f msg/s)", s.Devices, s.Published, s.Failed, s.Elapsed.Round(time.Millisecond), rate)
}

// run connects the devices, publishes until ctx ends, --duration passes or
// every device sent --count messages, disconnects them and returns the counters.
func run(ctx context.Context, o options, out io.Writer) (Summary, error) {
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}

	// Connect every device first, so a wrong address or password stops the
	// fleet at once instead of as thousands of errors.
	clients := make([]mqtt.Client, o.devices)
	errs := make([]error, o.devices)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() { clients[i], errs[i] = connect(o, deviceID(o, i)) })
	}
	wg.Wait()
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Disconnect(250)
			}
		}
	}()
	if err := errors.Join(errs...); err != nil {
		return Summary{}, err
	}
	fmt.Fprintf(out, "fleet: %d devices connected to %s, publishing %s/<device-id> at %g msg/s each, QoS %d\n",
		o.devices, o.broker, o.topic, o.rate, o.qos)

	var published, failed atomic.Int64
	start := time.Now()
	pctx, stopReport := context.WithCancel(ctx)
	var bg sync.WaitGroup
	if o.report > 0 {
		bg.Go(func() {
			t := time.NewTicker(o.report)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					fmt.Fprintf(out, "fleet: published=%d failed=%d\n", published.Load(), failed.Load())
				case <-pctx.Done():
					return
				}
			}
		})
	}
	for i, c := range clients {
		wg.Go(func() { device(ctx, o, c, deviceID(o, i), &published, &failed) })
	}
	wg.Wait()
	stopReport()
	bg.Wait()
	s := Summary{Devices: o.devices, Published: published.Load(), Failed: failed.Load(), Elapsed: time.Since(start)}
	fmt.Fprintf(out, "fleet: done: %s\n", s)
	return s, nil
}

func deviceID(o options, i int) string { return fmt.Sprintf("%s%04d", o.idPrefix, i+1) }

func connect(o options, id string) (mqtt.Client, error) {
	opts := mqtt.NewClientOptions().
		AddBroker(o.broker).
		SetClientID(id).
		SetProtocolVersion(4). // MQTT 3.1.1
		SetCleanSession(true).
		SetKeepAlive(30 * time.Second).
		SetAutoReconnect(false).
		SetConnectTimeout(o.connectDur).
		SetOrderMatters(true)
	if o.username != "" {
		opts.SetUsername(o.username).SetPassword(o.password)
	}
	c := mqtt.NewClient(opts)
	tok := c.Connect()
	if !tok.WaitTimeout(o.connectDur) {
		c.Disconnect(0)
		return nil, fmt.Errorf("%s: no CONNACK within %v", id, o.connectDur)
	}
	if err := tok.Error(); err != nil {
		return nil, fmt.Errorf("%s: connect %s: %w", id, o.broker, err)
	}
	return c, nil
}

// device publishes one device's telemetry, one message at a time: a QoS >= 1
// publish is acknowledged before the next, so the broker sees the sequence
// numbers in order.
func device(ctx context.Context, o options, c mqtt.Client, id string, published, failed *atomic.Int64) {
	interval := time.Duration(float64(time.Second) / o.rate)
	topic := o.topic + "/" + id
	temp := 18 + 6*rand.Float64()
	// Spread the devices over the first interval instead of a burst each tick.
	select {
	case <-time.After(rand.N(interval + 1)):
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for seq := 1; o.count == 0 || seq <= o.count; seq++ {
		temp += rand.Float64() - 0.5
		payload := fmt.Sprintf(`{"device":%q,"seq":%d,"ts":%d,"temp":%.2f}`, id, seq, time.Now().UnixMilli(), temp)
		tok := c.Publish(topic, byte(o.qos), false, payload)
		if !tok.WaitTimeout(o.connectDur) || tok.Error() != nil {
			failed.Add(1)
			if !c.IsConnectionOpen() {
				return // cut off: the rest of its messages are lost, counted once
			}
			continue
		}
		published.Add(1)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}
