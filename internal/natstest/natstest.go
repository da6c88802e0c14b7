// Package natstest starts real NATS clusters with JetStream for tests: in
// process (embedded nats-server), or as child processes that a test can
// SIGKILL (the test binary re-executed in a mode that runs one server; call
// MaybeRunChild first thing in TestMain).
//
// A graceful Shutdown() hands JetStream leadership over in milliseconds, so
// a crash must be a SIGKILL of a child process.
package natstest

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// FreePort returns a loopback TCP port that was free a moment ago. The
// servers bind their ports only later (a child process first has to
// start), so the port is taken below the kernel's ephemeral range: there
// no outgoing connection of another test (thousands of them run beside
// these) and no listener on port 0 can take it in between.
func FreePort(t testing.TB) int {
	t.Helper()
	low := ephemeralLow()
	for range 1000 {
		port := portFloor + rand.IntN(low-portFloor)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // in use: another one
		}
		l.Close()
		return port
	}
	t.Fatalf("no free port in %d-%d", portFloor, low-1)
	return 0
}

// portFloor is the lowest port FreePort hands out.
const portFloor = 10000

// ephemeralLow returns the first port of the kernel's ephemeral range
// (Linux: /proc/sys/net/ipv4/ip_local_port_range; 32768 when unknown).
func ephemeralLow() int {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > portFloor+1000 {
				low = v
			}
		}
	}
	return low
}

// spec is one server of a cluster, as a child process receives it.
type spec struct {
	Name        string   `json:"name"`
	Port        int      `json:"port"`
	ClusterPort int      `json:"cluster_port"`
	Routes      []string `json:"routes"`
	StoreDir    string   `json:"store_dir"`
}

func (s spec) options() *server.Options {
	var routes []*url.URL
	for _, r := range s.Routes {
		u, _ := url.Parse(r)
		routes = append(routes, u)
	}
	return &server.Options{
		ServerName: s.Name,
		Host:       "127.0.0.1", Port: s.Port,
		JetStream: true, StoreDir: s.StoreDir,
		Cluster: server.ClusterOpts{Name: "kl", Host: "127.0.0.1", Port: s.ClusterPort},
		Routes:  routes,
		NoSigs:  true, NoLog: true, DisableJetStreamBanner: true,
	}
}

func specs(t testing.TB, n int) []spec {
	dir := t.TempDir()
	out := make([]spec, n)
	var routes []string
	for i := range out {
		out[i] = spec{Name: fmt.Sprintf("n%d", i+1), Port: FreePort(t), ClusterPort: FreePort(t), StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", out[i].ClusterPort))
	}
	for i := range out {
		out[i].Routes = routes
	}
	return out
}

// Cluster is an in-process NATS cluster.
type Cluster struct {
	Servers []*server.Server
	// MQTTAddrs are the servers' MQTT listeners (Options.MQTT), in order.
	MQTTAddrs []string
}

// Start starts an n-server JetStream cluster in process (n == 1: a single
// server) and waits until it has a JetStream meta leader. It shuts down
// when the test ends.
func Start(t testing.TB, n int) *Cluster { return StartWith(t, n, Options{}) }

// Options are what StartWith adds to a cluster.
type Options struct {
	// MQTT gives every server nats-server's own MQTT listener (the peer of
	// the cluster benchmarks): MQTTAddrs lists them.
	MQTT bool
}

// StartWith is Start with options.
//
// Each server's ports are chosen as it starts: its client listener on a
// port the kernel picks at bind, its route (and MQTT) listener on a
// FreePort taken just before, with routes to the servers started before it
// (and to itself, which nats-server ignores, so the first server has the
// configured route JetStream clustering asks for). Choosing every port up
// front, as Start once did, left the later servers' ports free for seconds
// while the earlier ones started, and another test process's FreePort
// could take one meanwhile: that server then did not listen, silently
// (NoLog), and the test failed after a 10 s wait with "not ready".
func StartWith(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	c := &Cluster{}
	t.Cleanup(c.Shutdown)
	dir := t.TempDir()
	var routes []string
	for i := range n {
		s := spec{Name: fmt.Sprintf("n%d", i+1), Port: server.RANDOM_PORT, StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
		if n > 1 {
			s.ClusterPort = FreePort(t)
			s.Routes = append(slices.Clone(routes), fmt.Sprintf("nats-route://127.0.0.1:%d", s.ClusterPort))
		}
		o := s.options()
		if n == 1 {
			o.Cluster, o.Routes = server.ClusterOpts{}, nil
		}
		if opts.MQTT {
			o.MQTT = server.MQTTOpts{Host: "127.0.0.1", Port: FreePort(t)}
			c.MQTTAddrs = append(c.MQTTAddrs, fmt.Sprintf("127.0.0.1:%d", o.MQTT.Port))
		}
		c.Servers = append(c.Servers, startServer(t, o))
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", s.ClusterPort))
	}
	mqtttest.Eventually(t, 30*time.Second, "a JetStream meta leader", func() bool { return c.hasLeader(n) })
	return c
}

// startServer starts one in-process server and returns once its listeners
// listen. Start binds the client (and MQTT) listener before it returns and
// starts the route listener on a goroutine of its own: the server's log says
// when that listens, or why a listener could not bind (a port another
// process took), which fails the test at once with nats-server's reason.
func startServer(t testing.TB, o *server.Options) *server.Server {
	t.Helper()
	srv, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
	lg := &startLog{routes: make(chan struct{}), fatal: make(chan string, 4)}
	srv.SetLogger(lg, false, false)
	srv.Start()
	if o.Cluster.Port == 0 {
		lg.close()
	}
	select {
	case <-lg.routes:
	case msg := <-lg.fatal:
		srv.Shutdown()
		t.Fatalf("nats server %s: %s", o.ServerName, msg)
	case <-time.After(time.Minute):
		// The route listener binds on a goroutine Start has just started:
		// a minute only bounds a server that hangs.
		srv.Shutdown()
		t.Fatalf("nats server %s: route listener not listening after a minute", o.ServerName)
	}
	select {
	case msg := <-lg.fatal:
		srv.Shutdown()
		t.Fatalf("nats server %s: %s", o.ServerName, msg)
	default:
	}
	if srv.Addr() == nil {
		srv.Shutdown()
		t.Fatalf("nats server %s: not listening for clients", o.ServerName)
	}
	return srv
}

// startLog is a server's logger while it starts: it reports the route
// listener listening and fatal errors (the listeners' bind errors among
// them), and drops everything else (the servers run with NoLog).
type startLog struct {
	once   sync.Once
	routes chan struct{}
	fatal  chan string
}

func (l *startLog) close() { l.once.Do(func() { close(l.routes) }) }

func (l *startLog) Noticef(format string, v ...any) {
	if strings.HasPrefix(format, "Listening for route connections") {
		l.close()
	}
}

func (l *startLog) Fatalf(format string, v ...any) {
	select {
	case l.fatal <- fmt.Sprintf(format, v...):
	default:
	}
}

func (l *startLog) Warnf(string, ...any)  {}
func (l *startLog) Errorf(string, ...any) {}
func (l *startLog) Debugf(string, ...any) {}
func (l *startLog) Tracef(string, ...any) {}

func (c *Cluster) hasLeader(n int) bool {
	for _, s := range c.Servers {
		if s.Running() && s.JetStreamIsLeader() && (n == 1 || len(s.JetStreamClusterPeers()) == n) {
			return true
		}
	}
	return false
}

// URLs returns the client URLs of the running servers.
func (c *Cluster) URLs() []string {
	var out []string
	for _, s := range c.Servers {
		if s.Running() {
			out = append(out, s.ClientURL())
		}
	}
	return out
}

// Shutdown stops every server.
func (c *Cluster) Shutdown() {
	for _, s := range c.Servers {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// --- child processes ---

const childEnv = "KEYLINE_NATSTEST_CHILD"

// MaybeRunChild runs one NATS server and never returns when the test
// binary was started as a natstest child; otherwise it returns at once.
func MaybeRunChild() {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return
	}
	var s spec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fmt.Fprintln(os.Stderr, "natstest child:", err)
		os.Exit(2)
	}
	srv, err := server.NewServer(s.options())
	if err != nil {
		fmt.Fprintln(os.Stderr, "natstest child:", err)
		os.Exit(2)
	}
	srv.Start()
	srv.WaitForShutdown()
	os.Exit(0)
}

// ProcCluster is a NATS cluster of child processes.
type ProcCluster struct {
	bin   string // nats-server binary; "" re-executes the test binary
	dir   string
	specs []spec
	procs []*exec.Cmd
}

// StartProcs starts an n-server cluster of child processes (the test
// binary's TestMain must call MaybeRunChild) and waits until JetStream
// answers. The children are killed when the test ends.
func StartProcs(t testing.TB, n int) *ProcCluster {
	t.Helper()
	c := NewProcs(t, n, "")
	for i := range c.specs {
		c.Start(t, i)
	}
	c.WaitJetStream(t)
	return c
}

// NewProcs prepares an n-server cluster of child processes, none started:
// each runs bin (a nats-server binary, see ServerBin), or the test binary
// when bin is "". The children are killed when the test ends.
func NewProcs(t testing.TB, n int, bin string) *ProcCluster {
	t.Helper()
	c := &ProcCluster{bin: bin, dir: t.TempDir(), specs: specs(t, n), procs: make([]*exec.Cmd, n)}
	t.Cleanup(c.KillAll)
	return c
}

// WaitJetStream waits until every server listens and JetStream answers.
func (c *ProcCluster) WaitJetStream(t testing.TB) {
	t.Helper()
	for i := range c.specs {
		waitTCP(t, c.specs[i].Port)
	}
	nc, err := nats.Connect(strings.Join(c.URLs(), ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	last := ""
	ok := mqtttest.Within(30*time.Second, func() bool { // JetStream has no readiness event to wait on
		var info struct {
			Error *struct{} `json:"error"`
		}
		m, err := nc.Request("$JS.API.INFO", nil, 2*time.Second)
		switch {
		case err != nil:
			last = err.Error()
		case json.Unmarshal(m.Data, &info) != nil || info.Error != nil:
			last = string(m.Data)
		default:
			return true
		}
		return false
	})
	if !ok {
		t.Fatalf("JetStream not available within 30s: last answer %s; connected to %s; servers %+v", last, nc.ConnectedUrl(), c.specs)
	}
}

// Start starts server i without waiting for it.
func (c *ProcCluster) Start(t testing.TB, i int) {
	t.Helper()
	var cmd *exec.Cmd
	if c.bin == "" {
		raw, _ := json.Marshal(c.specs[i])
		cmd = exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	} else {
		conf := filepath.Join(c.dir, c.specs[i].Name+".conf")
		if err := os.WriteFile(conf, []byte(c.specs[i].config()), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command(c.bin, "-c", conf)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.procs[i] = cmd
}

// config is the server's configuration file for a nats-server binary.
func (s spec) config() string {
	var routes []string
	for _, r := range s.Routes {
		routes = append(routes, strconv.Quote(r))
	}
	return fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\njetstream { store_dir: %q }\n"+
		"cluster { name: kl, listen: 127.0.0.1:%d, routes: [%s] }\n",
		s.Name, s.Port, s.StoreDir, s.ClusterPort, strings.Join(routes, ", "))
}

// ServerBin returns $KEYLINE_NATS_SERVER: a nats-server binary for
// NewProcs, or "" (the test binary runs the servers).
func ServerBin() string { return os.Getenv("KEYLINE_NATS_SERVER") }

func waitTCP(t testing.TB, port int) {
	t.Helper()
	mqtttest.Eventually(t, 15*time.Second, fmt.Sprintf("the nats server on port %d to listen", port), func() bool {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
}

// URLs returns every server's client URL (killed ones included: clients skip them).
func (c *ProcCluster) URLs() []string {
	out := make([]string, len(c.specs))
	for i, s := range c.specs {
		out[i] = fmt.Sprintf("nats://127.0.0.1:%d", s.Port)
	}
	return out
}

// Kill SIGKILLs server i.
func (c *ProcCluster) Kill(i int) {
	if p := c.procs[i]; p != nil && p.Process != nil {
		_ = p.Process.Signal(syscall.SIGKILL)
		_ = p.Wait()
		c.procs[i] = nil
	}
}

// Restart starts server i again (same name and store).
func (c *ProcCluster) Restart(t testing.TB, i int) {
	c.Start(t, i)
	waitTCP(t, c.specs[i].Port)
}

// KillAll SIGKILLs every server.
func (c *ProcCluster) KillAll() {
	for i := range c.procs {
		c.Kill(i)
	}
}
