// Package natstest starts real NATS clusters with JetStream for tests: in
// process (embedded nats-server), or as child processes that a test can
// SIGKILL (the test binary re-executed in a mode that runs one server; call
// MaybeRunChild first thing in TestMain).
//
// A graceful Shutdown() hands JetStream leadership over in milliseconds, so
// a crash must be a SIGKILL of a child process.
package natstest

import (
	"bytes"
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
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/logger"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// FreePort returns a loopback TCP port that was free a moment ago and
// that no other FreePort hands out until the test ends. The servers bind
// their ports only later (a child process first has to start), so the port
// is taken below the kernel's ephemeral range, where no outgoing connection
// and no listener on port 0 can take it in between; and it is reserved
// across processes (test packages run in parallel, each with its own NATS
// clusters) by an flock on a file named after it, held until the test
// ends (the kernel drops it when the process dies, SIGKILL included).
// Without the reservation two packages could pick the same port within the
// second before either bound it: one server then did not listen, or joined
// the other package's cluster.
func FreePort(t testing.TB) int {
	t.Helper()
	low := ephemeralLow()
	dir := filepath.Join(os.TempDir(), "keyline-natstest-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		port := portFloor + rand.IntN(low-portFloor)
		release, ok := reserve(dir, port)
		if !ok {
			continue // another process's, or ours
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			release()
			continue // in use: another one
		}
		l.Close()
		t.Cleanup(release)
		return port
	}
	t.Fatalf("no free port in %d-%d", portFloor, low-1)
	return 0
}

// reserved holds the ports this process reserved: flock is per open file,
// so a second open of the same file in this process would get the lock too.
var reserved sync.Map

// reserve takes the flock of port's file in dir and returns its release,
// or reports that someone (another process, or this one) holds it.
func reserve(dir string, port int) (func(), bool) {
	if _, dup := reserved.LoadOrStore(port, true); dup {
		return nil, false
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err == nil {
		if err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
		}
	}
	if err != nil {
		reserved.Delete(port)
		return nil, false
	}
	return func() {
		f.Close()
		reserved.Delete(port)
	}, true
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
	Cluster     string   `json:"cluster"`
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
		Cluster: server.ClusterOpts{Name: s.Cluster, Host: "127.0.0.1", Port: s.ClusterPort},
		Routes:  routes,
		NoSigs:  true, NoLog: true, DisableJetStreamBanner: true,
	}
}

// clusterName names a new test cluster: unique on the machine (the
// process id and a counter), so that a route that reaches another test's
// server (a port reused the moment it was freed) is refused by NATS for its
// cluster name instead of merging two clusters into one.
func clusterName() string { return fmt.Sprintf("kl-%d-%d", os.Getpid(), clusters.Add(1)) }

var clusters atomic.Uint64

func specs(t testing.TB, n int) []spec {
	dir := t.TempDir()
	out := make([]spec, n)
	name := clusterName()
	var routes []string
	for i := range out {
		out[i] = spec{Name: fmt.Sprintf("n%d", i+1), Cluster: name, Port: FreePort(t), ClusterPort: FreePort(t), StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
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
	names   []string
	logs    []*tail
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
	t.Cleanup(func() { logOnFailure(t, c.names, c.logs) })
	dir := t.TempDir()
	name := clusterName()
	var routes []string
	for i := range n {
		s := spec{Name: fmt.Sprintf("n%d", i+1), Cluster: name, Port: server.RANDOM_PORT, StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1))}
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
		lg := &startLog{routes: make(chan struct{}), fatal: make(chan string, 4)}
		c.names, c.logs = append(c.names, s.Name), append(c.logs, &lg.tail)
		c.Servers = append(c.Servers, startServer(t, o, lg))
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
func startServer(t testing.TB, o *server.Options, lg *startLog) *server.Server {
	t.Helper()
	srv, err := server.NewServer(o)
	if err != nil {
		t.Fatal(err)
	}
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

// startLog is an in-process server's logger: it reports the route
// listener listening and fatal errors (the listeners' bind errors among
// them) while the server starts, and keeps the tail of what the server
// logs (notices, warnings, errors), which the test prints if it fails.
type startLog struct {
	once   sync.Once
	routes chan struct{}
	fatal  chan string
	tail   tail
}

func (l *startLog) close() { l.once.Do(func() { close(l.routes) }) }

func (l *startLog) Noticef(format string, v ...any) {
	if strings.HasPrefix(format, "Listening for route connections") {
		l.close()
	}
	l.tail.line("INF", format, v)
}

func (l *startLog) Fatalf(format string, v ...any) {
	select {
	case l.fatal <- fmt.Sprintf(format, v...):
	default:
	}
	l.tail.line("FTL", format, v)
}

func (l *startLog) Warnf(format string, v ...any)  { l.tail.line("WRN", format, v) }
func (l *startLog) Errorf(format string, v ...any) { l.tail.line("ERR", format, v) }
func (l *startLog) Debugf(string, ...any)          {}
func (l *startLog) Tracef(string, ...any)          {}

// tail keeps the last tailLines lines written to it.
type tail struct {
	mu    sync.Mutex
	lines []string
	part  []byte // a line not yet ended (Write)
	cut   int    // lines dropped from the front
}

const tailLines = 400

func (t *tail) line(level, format string, v []any) {
	t.add(time.Now().Format("15:04:05.000") + " [" + level + "] " + fmt.Sprintf(format, v...))
}

func (t *tail) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, line)
	if len(t.lines) > tailLines {
		t.cut += len(t.lines) - tailLines
		t.lines = slices.Delete(t.lines, 0, len(t.lines)-tailLines)
	}
}

// Write takes a child process's stderr, line by line.
func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	buf := append(t.part, p...)
	var done []string
	for {
		i := bytes.IndexByte(buf, '\n')
		if i < 0 {
			break
		}
		done = append(done, string(buf[:i]))
		buf = buf[i+1:]
	}
	t.part = slices.Clone(buf)
	t.mu.Unlock()
	for _, l := range done {
		t.add(l)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	head := ""
	if t.cut > 0 {
		head = fmt.Sprintf("(%d earlier lines not kept)\n", t.cut)
	}
	return head + strings.Join(t.lines, "\n") + string(t.part)
}

// logOnFailure prints the servers' logs when the test has failed.
func logOnFailure(t testing.TB, names []string, tails []*tail) {
	t.Helper()
	if !t.Failed() {
		return
	}
	for i, tl := range tails {
		if tl != nil {
			t.Logf("nats server %s log:\n%s", names[i], tl)
		}
	}
}

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
	// The log goes to stderr, which the parent keeps (a test that fails
	// prints it); a fatal error (a listener that cannot bind) ends the
	// process, as it ends a nats-server binary, instead of leaving a server
	// without its port.
	srv.SetLogger(logger.NewStdLogger(true, false, false, false, false), false, false)
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
	logs  []*tail // each server's stderr, over its restarts
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
	c := &ProcCluster{bin: bin, dir: t.TempDir(), specs: specs(t, n), procs: make([]*exec.Cmd, n), logs: make([]*tail, n)}
	t.Cleanup(c.KillAll)
	t.Cleanup(func() {
		var names []string
		for _, s := range c.specs {
			names = append(names, s.Name)
		}
		logOnFailure(t, names, c.logs)
	})
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
	if c.logs[i] == nil {
		c.logs[i] = &tail{}
	}
	cmd.Stdout, cmd.Stderr = c.logs[i], c.logs[i]
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
		"cluster { name: %s, listen: 127.0.0.1:%d, routes: [%s] }\n",
		s.Name, s.Port, s.StoreDir, s.Cluster, s.ClusterPort, strings.Join(routes, ", "))
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
