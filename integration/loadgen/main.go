// Command loadgen drives an MQTT 3.1.1/5 broker with raw frames and prints
// one JSON line of results per run.
//
//	loadgen -addr 127.0.0.1:1883 -scenario fanout -subs 100 -duration 5s
//	loadgen -scenario shared -consumers 8 -keys 64 -key-mode prop
//	loadgen -scenario fanin -pubs 100 -subs 1
//	loadgen -scenario slowsub -subs 10 -stalled 1 -rate 20000 -broker-pid 1234
//	loadgen -scenario conflate -topics 1000 -rate 10000 -read-rate 100000
//	loadgen -scenario connections -conns 10000 -broker-pid 1234 [-broker-pprof http://127.0.0.1:9883/debug/pprof]
//	loadgen -scenario wake -conns 10000 -period 1m -duration 1m -broker-pid 1234
//	loadgen ping -addr 127.0.0.1:1883 -timeout 10s   (wait until a broker answers CONNECT)
//	loadgen freeport                                 (print a free loopback TCP port)
//	loadgen nullbroker -addr 127.0.0.1:1884          (calibration target: QoS 0 exact-topic forwarding, no MQTT semantics)
//	loadgen probe -dir /path/on/the/disk             (cost of a syscall, latency of write + fdatasync, the fsync bound)
//
// Publishers, subscribers and consumers speak hand-encoded MQTT over one
// bufio reader and one write buffer per connection; publishers stamp the
// send time into the payload just before each write. The tool measures its
// own CPU (getrusage) and, given -broker-pid, the broker's CPU and RSS.
// It only connects where -addr says; the benchmark script gives it loopback
// addresses. Every run is bounded: warm-up + duration + drain, plus a
// watchdog that ends the process if the broker hangs.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"
)

type config struct {
	addr        string
	addrs       []string // addr split at commas: publishers use the first, subscribers take them in turn
	scenario    string
	label       string
	proto       byte
	qos         byte
	payload     int
	pubs        int
	subs        int
	topics      int
	stalled     int
	stallRcvbuf int
	readRate    int
	rate        float64
	ahead       int
	inflight    int
	duration    time.Duration
	warmup      time.Duration
	drain       time.Duration
	drainIdle   time.Duration
	timeout     time.Duration
	settle      time.Duration
	consumers   int
	groups      int
	keys        int
	keyMode     string
	group       bool
	conns       int
	conc        int
	brokerPID   int
	brokerPIDs  []int // CPU is summed over these (a cluster: its nodes and NATS servers); brokerPID is the first
	rssEvery    time.Duration
	readBuf     int
	flushBytes  int
	cpuProfile  string
	count       int
	keepalive   uint16
	tag         string
	round       int
	brokerPprof string
	subscribe   bool
	period      time.Duration
	transport   string
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "ping":
			return cmdPing(args[1:], stdout, stderr)
		case "nullbroker":
			return cmdNullBroker(args[1:], stdout, stderr)
		case "probe":
			return cmdProbe(args[1:], stdout, stderr)
		case "freeport":
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				fmt.Fprintln(stderr, "loadgen:", err)
				return 1
			}
			fmt.Fprintln(stdout, ln.Addr().(*net.TCPAddr).Port)
			ln.Close()
			return 0
		}
	}
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "loadgen:", err)
		return 2
	}
	if cfg.cpuProfile != "" {
		f, err := os.Create(cfg.cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, "loadgen:", err)
			return 2
		}
		pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	res := runScenario(cfg, args)
	b, _ := json.Marshal(res)
	fmt.Fprintln(stdout, string(b))
	if !res.OK {
		for _, e := range res.Errors {
			fmt.Fprintln(stderr, "loadgen:", e)
		}
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var proto, qos int
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:1883", "broker address host:port; a comma-separated list for a cluster: publishers connect to the first, subscribers and group members to each in turn from the second")
	fs.StringVar(&cfg.scenario, "scenario", "fanout", "fanout, fanin, shared, slowsub, conflate, connections, sessions or wake")
	fs.StringVar(&cfg.label, "label", "", "broker name echoed in the JSON")
	fs.StringVar(&cfg.tag, "tag", "", "case name echoed in the JSON (the benchmark script's name for this run)")
	fs.IntVar(&cfg.round, "round", 0, "round number echoed in the JSON")
	fs.IntVar(&proto, "proto", 5, "MQTT protocol level: 4 (3.1.1) or 5")
	fs.IntVar(&qos, "qos", -1, "QoS of publishes and subscriptions (default: 1 for shared, else 0)")
	fs.IntVar(&cfg.payload, "payload", 64, fmt.Sprintf("payload bytes (at least %d: run id, publisher, timestamp, sequences, key)", payloadMin))
	fs.IntVar(&cfg.pubs, "pubs", 1, "publishers")
	fs.IntVar(&cfg.subs, "subs", 10, "subscribers (fanout, fanin, slowsub: the reading ones)")
	fs.IntVar(&cfg.topics, "topics", 1, "fanout: topics; publishers rotate over them and subscriber j takes topic j%topics (conflate: the reader takes all)")
	fs.IntVar(&cfg.stalled, "stalled", -1, "slowsub: subscribers that never read their socket (default 1)")
	fs.IntVar(&cfg.stallRcvbuf, "stall-rcvbuf", 4096, "SO_RCVBUF of stalled (and rate-limited) subscribers, so the backlog sits in the broker, not the kernel")
	fs.IntVar(&cfg.readRate, "read-rate", 100_000, "conflate: bytes/s the reader reads")
	fs.Float64Var(&cfg.rate, "rate", 0, "messages/s published in all (0: flood, as fast as the gate allows)")
	fs.IntVar(&cfg.ahead, "ahead", 100, "a publisher may run at most this many messages ahead of its slowest reading subscriber (or its group); 0: no limit")
	fs.IntVar(&cfg.inflight, "inflight", 1000, "QoS 1/2: unacknowledged publishes per publisher (capped by the broker's Receive Maximum)")
	fs.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured window (with -count: the longest the publishers may take)")
	var keepalive uint
	fs.UintVar(&keepalive, "keepalive", 60, "MQTT keep-alive in seconds sent in CONNECT (PINGREQ every half period; 0: none)")
	fs.IntVar(&cfg.count, "count", 0, "messages per publisher, instead of a timed window (no warm-up: every message counts)")
	fs.DurationVar(&cfg.warmup, "warmup", time.Second, "publishing before the measured window")
	fs.DurationVar(&cfg.drain, "drain", 5*time.Second, "after publishing stops, longest wait for outstanding deliveries")
	fs.DurationVar(&cfg.drainIdle, "drain-idle", time.Second, "the drain also ends once nothing arrived for this long")
	fs.DurationVar(&cfg.timeout, "timeout", 10*time.Second, "connect/subscribe timeout")
	fs.DurationVar(&cfg.settle, "settle", time.Second, "connections: wait before reading the broker's RSS")
	fs.IntVar(&cfg.consumers, "consumers", 8, "shared: consumers in the $share group (in each group, with -groups)")
	fs.IntVar(&cfg.groups, "groups", 1, "shared: independent $share groups (lg0, lg1, ...), each on a topic of its own (bench/shared/gN); key k belongs to group k % groups")
	fs.IntVar(&cfg.keys, "keys", 64, "shared: routing keys")
	fs.StringVar(&cfg.keyMode, "key-mode", "prop", "shared: prop (MQTT 5 user property key=kN on topic bench/shared) or topic (bench/shared/kN)")
	fs.BoolVar(&cfg.group, "group", false, "fanin: subscribers form one $share group")
	fs.IntVar(&cfg.conns, "conns", 10000, "connections: idle connections to open; sessions: persistent sessions to create and leave")
	fs.IntVar(&cfg.conc, "conc", 64, "connects in flight at once")
	var pids string
	fs.StringVar(&pids, "broker-pid", "", "broker process id, for its CPU time and RSS from /proc; a comma-separated list sums their CPU (RSS: the first)")
	fs.DurationVar(&cfg.rssEvery, "rss-every", 200*time.Millisecond, "RSS sampling interval")
	fs.IntVar(&cfg.readBuf, "read-buf", 64<<10, "bytes of read buffer per connection")
	fs.IntVar(&cfg.flushBytes, "flush-bytes", 16<<10, "a publisher writes when this many bytes are pending (or when it waits)")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of the load generator to this file")
	fs.StringVar(&cfg.brokerPprof, "broker-pprof", "", "a Go broker's pprof base URL (e.g. http://127.0.0.1:9883/debug/pprof): connections and sessions also report its heap, goroutine stacks and goroutines")
	fs.BoolVar(&cfg.subscribe, "subscribe", true, "connections, wake: each connection subscribes to a topic of its own (QoS 1) after CONNECT, as a device takes its commands")
	fs.StringVar(&cfg.transport, "transport", "tcp", "connections: tcp, tls (any certificate) or ws (MQTT over WebSocket, path /)")
	fs.DurationVar(&cfg.period, "period", time.Minute, "wake: each connection publishes one QoS 1 message per period, the connections' publishes spread evenly over it")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, a := range strings.Split(cfg.addr, ",") {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return cfg, fmt.Errorf("-addr %q: %v", a, err)
		}
		cfg.addrs = append(cfg.addrs, a)
	}
	if pids != "" {
		for _, f := range strings.Split(pids, ",") {
			pid, err := strconv.Atoi(f)
			if err != nil || pid <= 0 {
				return cfg, fmt.Errorf("-broker-pid: %q is not a process id", f)
			}
			cfg.brokerPIDs = append(cfg.brokerPIDs, pid)
		}
		cfg.brokerPID = cfg.brokerPIDs[0]
	}
	if proto != 4 && proto != 5 {
		return cfg, fmt.Errorf("-proto must be 4 or 5, not %d", proto)
	}
	cfg.proto = byte(proto)
	switch cfg.scenario {
	case "fanout", "fanin", "slowsub", "connections", "conflate", "sessions", "wake":
		if qos < 0 {
			qos = 0
		}
	case "shared":
		if qos < 0 {
			qos = 1
		}
	default:
		return cfg, fmt.Errorf("unknown -scenario %q (fanout, fanin, shared, slowsub, conflate, connections, sessions, wake)", cfg.scenario)
	}
	if qos > 2 {
		return cfg, fmt.Errorf("-qos must be 0, 1 or 2")
	}
	cfg.qos = byte(qos)
	if cfg.stalled < 0 {
		cfg.stalled = 0
		if cfg.scenario == "slowsub" {
			cfg.stalled = 1
		}
	}
	if cfg.scenario != "fanout" && cfg.scenario != "slowsub" && cfg.stalled > 0 {
		return cfg, fmt.Errorf("-stalled applies to fanout and slowsub")
	}
	if cfg.payload < payloadMin {
		return cfg, fmt.Errorf("-payload must be at least %d bytes", payloadMin)
	}
	if cfg.keyMode != "prop" && cfg.keyMode != "topic" {
		return cfg, fmt.Errorf("-key-mode must be prop or topic")
	}
	if cfg.pubs < 1 || cfg.subs < 0 || cfg.conc < 1 || cfg.inflight < 1 {
		return cfg, fmt.Errorf("-pubs, -conc and -inflight must be at least 1")
	}
	if cfg.scenario != "connections" && cfg.scenario != "sessions" && cfg.scenario != "wake" && cfg.scenario != "shared" && cfg.subs < 1 {
		return cfg, fmt.Errorf("-subs must be at least 1")
	}
	if keepalive > 65535 {
		return cfg, fmt.Errorf("-keepalive must be at most 65535")
	}
	cfg.keepalive = uint16(keepalive)
	if cfg.count < 0 {
		return cfg, fmt.Errorf("-count must not be negative")
	}
	if cfg.duration <= 0 || cfg.warmup < 0 || cfg.drain < 0 || cfg.drainIdle <= 0 {
		return cfg, fmt.Errorf("-duration must be positive, -warmup and -drain not negative, -drain-idle positive")
	}
	if cfg.scenario == "wake" && cfg.period <= 0 {
		return cfg, fmt.Errorf("-period must be positive")
	}
	if cfg.scenario == "conflate" && (cfg.readRate < 1 || cfg.rate <= 0) {
		return cfg, fmt.Errorf("-scenario conflate needs -rate and -read-rate above 0")
	}
	if cfg.readBuf < 256 || cfg.flushBytes < 1 {
		return cfg, fmt.Errorf("-read-buf must be at least 256")
	}
	return cfg, nil
}

func runScenario(cfg config, args []string) *result {
	res := &result{Scenario: cfg.scenario, Label: cfg.label, Tag: cfg.tag, Round: cfg.round, Addr: cfg.addr, Args: append([]string{}, args...),
		Proto: int(cfg.proto), QoS: int(cfg.qos), Payload: cfg.payload, Pubs: cfg.pubs, Subs: cfg.subs,
		Rate: cfg.rate, Ahead: cfg.ahead, Window: cfg.duration.Seconds()}
	if res.Args == nil {
		res.Args = []string{}
	}
	// Watchdog: the run's own bound plus connect time; a hung broker must
	// not hang the benchmark.
	limit := cfg.warmup + cfg.duration + cfg.drain + 3*cfg.timeout + 30*time.Second
	if cfg.scenario == "connections" || cfg.scenario == "sessions" || cfg.scenario == "wake" {
		limit += cfg.settle + time.Duration(cfg.conns)*2*time.Millisecond // opened at 500/s at worst
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	wd := time.AfterFunc(limit+10*time.Second, func() {
		b, _ := json.Marshal(map[string]any{"scenario": cfg.scenario, "label": cfg.label, "ok": false, "errors": []string{"watchdog: run exceeded " + limit.String()}})
		fmt.Println(string(b))
		os.Exit(1)
	})
	defer wd.Stop()

	switch cfg.scenario {
	case "connections", "sessions", "wake":
		switch cfg.scenario {
		case "connections":
			runConnections(ctx, cfg, res)
		case "sessions":
			runSessions(ctx, cfg, res)
		default:
			runWake(ctx, cfg, res)
		}
		res.Subs = 0
		res.OK = len(res.Errors) == 0
		return res
	}
	r := newRun(cfg)
	var err error
	switch cfg.scenario {
	case "fanout", "slowsub":
		err = setupFanout(r)
		res.Topics = max(cfg.topics, 1)
		res.Stalled = cfg.stalled
	case "conflate":
		err = setupConflate(r)
		res.Topics = max(cfg.topics, 1)
		res.Subs = 1
	case "fanin":
		err = setupFanin(r)
		if cfg.group {
			res.Consumers = cfg.subs
		}
	case "shared":
		err = setupShared(r)
		res.Consumers = cfg.consumers * cfg.groups
		res.Subs = res.Consumers
		res.KeyMode = cfg.keyMode
		res.Pubs = r.cfg.pubs
	}
	if err != nil {
		res.Errors = append(res.Errors, err.Error())
		return res
	}
	res.Ahead = r.cfg.ahead
	r.execute(ctx, res)
	if len(res.Errors) == 0 && res.DeliveredAll == 0 {
		res.Errors = append(res.Errors, "nothing was delivered")
	}
	res.OK = len(res.Errors) == 0
	return res
}

// cmdPing waits until addr accepts an MQTT CONNECT, retrying until -timeout.
func cmdPing(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("loadgen ping", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:1883", "broker address")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after this long")
	proto := fs.Int("proto", 4, "MQTT protocol level")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	deadline := time.Now().Add(*timeout)
	var last error
	for i := 0; time.Now().Before(deadline); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		m, err := dialMQTT(ctx, *addr, "lg-ping-"+strconv.Itoa(os.Getpid()), dialOpts{proto: byte(*proto), timeout: time.Second, readBuf: 256})
		cancel()
		if err == nil {
			m.close()
			fmt.Fprintf(stdout, "broker at %s answered CONNECT\n", *addr)
			return 0
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintf(stderr, "loadgen ping: no MQTT broker at %s after %s: %v\n", *addr, *timeout, last)
	return 1
}
