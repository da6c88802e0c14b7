// Package broker assembles a Keyline broker: mochi's MQTT server, Keyline's
// listeners, hooks and store, and the HTTP endpoints for operators.
//
// A Broker is built with New, which validates the configuration, opens the
// data file and binds every address (so that bad input fails before anything
// runs), started with Start or Run, and stopped with Shutdown.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/bridge"
	"github.com/keyline-mq/keyline/broker/ops"
	"github.com/keyline-mq/keyline/cluster"
	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/conform"
	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/internal/netpoll"
	"github.com/keyline-mq/keyline/persistence"
)

// ErrClosed is returned by Start on a broker that has been shut down.
var ErrClosed = errors.New("broker: closed")

// Broker is one running Keyline broker.
type Broker struct {
	cfg     Config
	log     *slog.Logger
	started time.Time

	db       *persistence.DB
	sessions *persistence.SessionStore
	server   *mqtt.Server
	mqttLns  []*listener

	httpLn  net.Listener
	httpSrv *http.Server
	// httpConns bounds the HTTP connections (nil without --http).
	httpConns *httpConns

	connStats *connq.Stats    // totals of every connection's outbound queue
	poller    *netpoll.Poller // reads plain TCP connections (nil where unsupported)
	deadlines deadlines       // the read deadlines of the connections poller serves
	tls       *tlsServer      // the tls and wss listeners' certificates (nil without them; tlsconf.go)
	reload    reloads         // live reload (reload.go)
	rates     *hooks.RateLimits
	auth      *hooks.Auth
	be        backends       // the implementation behind each seam (backends.go)
	storage   *hooks.Storage // single node only
	retained  *hooks.Retained
	fanout    *hooks.Fanout
	keyShared *hooks.KeyShared
	bridges   *bridge.Manager // broker/bridges.go
	ops       *ops.Service    // the operator surface on the HTTP listener (package ops)
	cluster   *hooks.Cluster  // cluster mode only (broker/cluster.go)
	node      *cluster.Node   // cluster mode only
	groups    *cluster.Groups // cluster mode only: Key-Shared groups across nodes
	// clusterKS is keyShared for the cluster's callbacks, which start
	// before the hook exists.
	clusterKS atomic.Pointer[hooks.KeyShared]
	stop      chan struct{} // closed when Shutdown begins; ends background loops

	ready     atomic.Bool // serving MQTT and not shutting down
	startOnce sync.Once
	startErr  error
	stopOnce  sync.Once
	stopped   chan struct{} // closed when Shutdown has finished
	stopErr   error
	bg        sync.WaitGroup // goroutines Start launched
}

// New validates cfg, binds every listener, opens the data dir and returns a
// broker ready to Start. A nil logger discards logs. On error nothing is left
// open.
func New(cfg Config, logger *slog.Logger) (_ *Broker, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = slog.New(newLimitHandler(logger.Handler()))
	b := &Broker{cfg: cfg, log: logger, stopped: make(chan struct{}), stop: make(chan struct{})}
	defer func() {
		if err != nil {
			b.closeResources()
		}
	}()

	if b.tls, err = newTLSServer(&cfg, logger); err != nil {
		return nil, err
	}
	var tlsConf *tls.Config
	if b.tls != nil {
		tlsConf = b.tls.listenerConfig()
	}

	for _, l := range []struct {
		id, proto, addr string
		tls             *tls.Config
	}{{"tcp", "tcp", cfg.TCP, nil}, {"tls", "tls", cfg.TLS, tlsConf}, {"ws", "ws", cfg.WS, nil}, {"wss", "wss", cfg.WSS, tlsConf}} {
		if l.addr == "" {
			continue
		}
		ln, err := listen(l.id, l.proto, l.addr, l.tls, cfg.WSAllowedOrigins)
		if err != nil {
			return nil, fmt.Errorf("broker: %s listener: %w", l.id, err)
		}
		b.mqttLns = append(b.mqttLns, ln)
	}
	if cfg.HTTP != "" {
		b.httpLn, err = net.Listen("tcp", cfg.HTTP)
		if err != nil {
			return nil, fmt.Errorf("broker: http listener: %w", err)
		}
	}

	b.db, err = persistence.Open(cfg.DataDir, persistence.Options{NoSync: !cfg.Fsync, SegmentSize: int64(cfg.SegmentSize),
		CommitInterval: commitInterval(cfg.CommitInterval), CommitMinAppends: cfg.CommitMinAppends, Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("broker: data-dir %s: %w", cfg.DataDir, err)
	}
	b.sessions, err = b.db.OpenSessions()
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}

	b.server = mqtt.New(&mqtt.Options{
		Capabilities: b.capabilities(),
		Logger:       logger,
		// Every connection writes through its queue (internal/connq), which
		// never blocks: mochi needs no outbound channel and write goroutine
		// per client; and a disconnected session is kept as a compact record
		// (third_party/mochi/PATCHES.md).
		DirectWrites: true,
		// TLS and WebSocket connections keep mochi's blocking reader; it reads
		// from the TLS or WebSocket layer, which buffers the socket itself, so
		// a small buffer costs no system calls (2 KiB by default).
		ClientNetReadBufferSize: 512,
		// Not in cluster mode: the cluster hook knows a session by the
		// *mqtt.Client it was connected with, and the record replaces it.
		CompactSessions: !cfg.Cluster.Enabled(),
	})
	// Plain TCP connections are read from readiness events, with no
	// goroutine per connection (Linux; elsewhere, and for TLS and
	// WebSocket, a goroutine per connection reads: eventconn.go).
	if b.poller, err = netpoll.New(netpoll.Config{}); err != nil && !errors.Is(err, netpoll.ErrUnsupported) {
		return nil, fmt.Errorf("broker: %w", err)
	}
	info := b.server.Info
	b.connStats = &connq.Stats{
		InfoMessagesSent: &info.MessagesSent, InfoPacketsSent: &info.PacketsSent,
		InfoBytesSent: &info.BytesSent, InfoMessagesDropped: &info.MessagesDropped,
	}
	if err := b.newBridges(); err != nil {
		return nil, err
	}
	if err := b.addHooks(); err != nil {
		return nil, err
	}
	for _, ln := range b.mqttLns {
		limits, _ := cfg.connLimits(ln.id, "") // validated
		if ln.proto == "tcp" {
			ln.poller, ln.server, ln.deadlines = b.poller, b.server, &b.deadlines
		}
		ln.queue = func(c net.Conn) *connq.Conn {
			gcBurst.accepted(time.Now(), b.server.Clients.Len)
			q := connq.New(c, limits, b.connStats, logger)
			q.Inspect(conform.NewChecker(cfg.MaxPacketSize)) // what mochi's decoder lets through
			return q
		}
		ln.closeClients = b.sendAwayListenerClients
		if err := b.server.AddListener(ln); err != nil {
			return nil, fmt.Errorf("broker: add %s listener: %w", ln.id, err)
		}
	}
	if b.httpLn != nil {
		// Bounded: a client that opens many connections, or sends headers or
		// a body slowly, holds at most http-max-conns goroutines for at most
		// http-read-timeout each. No write timeout: live views stream.
		b.httpConns = newHTTPConns(cfg.HTTPMaxConns, cfg.HTTPMaxConnsPerAddress)
		b.httpLn = b.httpConns.listener(b.httpLn)
		b.httpSrv = &http.Server{
			ConnState:         b.httpConns.state,
			ConnContext:       withConn,
			Handler:           b.ops.Handler(),
			ReadHeaderTimeout: min(cfg.HTTPReadTimeout, 10*time.Second),
			ReadTimeout:       cfg.HTTPReadTimeout,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
		}
	}
	return b, nil
}

func (b *Broker) capabilities() *mqtt.Capabilities {
	c := mqtt.NewDefaultServerCapabilities()
	c.MaximumPacketSize = b.cfg.MaxPacketSize
	if b.cfg.MaxClients > 0 {
		c.MaximumClients = b.cfg.MaxClients
	}
	c.MaximumInflight = b.cfg.MaxInflight
	c.ReceiveMaximum = b.cfg.ReceiveMaximum
	c.MaximumSessionExpiryInterval = math.MaxUint32
	if b.cfg.MaxSessionExpiry > 0 {
		c.MaximumSessionExpiryInterval = uint32(b.cfg.MaxSessionExpiry / time.Second)
	}
	c.MaximumMessageExpiryInterval = int64(b.cfg.MaxMessageExpiry / time.Second)
	c.TopicAliasMaximum = b.cfg.TopicAliasMaximum
	c.TopicAliasBytes = int(b.cfg.TopicAliasBytes)
	c.MaximumTopicLevels = b.cfg.MaxTopicLevels
	c.MaximumClientIDLength = int(b.cfg.MaxClientID)
	c.MaximumClientSubscriptions = b.cfg.MaxSubscriptionsPerClient
	c.MaximumSubscriptions = b.cfg.MaxSubscriptions
	// The fan-out hook sends retained messages on SUBSCRIBE, through the
	// session's outbox like every other delivery (hooks/fanout_retained.go).
	c.Compatibilities.NoRetainedOnSubscribe = true
	return c
}

// Start loads the stored sessions and starts serving; it returns at once.
func (b *Broker) Start() error {
	b.startOnce.Do(func() {
		select {
		case <-b.stopped:
			b.startErr = ErrClosed
			return
		default:
		}
		b.started = time.Now()
		if err := b.fanout.RestoreSessions(b.sessions); err != nil {
			b.startErr = fmt.Errorf("broker: start: %w", err)
			return
		}
		if err := b.server.Serve(); err != nil {
			b.startErr = fmt.Errorf("broker: start: %w", err)
			return
		}
		if err := b.startBridges(); err != nil {
			b.startErr = fmt.Errorf("broker: start: %w", err)
			return
		}
		b.ops.Start()
		if b.httpSrv != nil {
			b.bg.Add(1)
			go func() {
				defer b.bg.Done()
				if err := b.httpSrv.Serve(b.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
					b.log.Error("http server stopped", "error", err)
				}
			}()
		}
		b.bg.Add(1)
		go func() {
			defer b.bg.Done()
			b.releaseMemory()
		}()
		if b.cfg.ReloadWatch > 0 {
			b.bg.Add(1)
			go func() {
				defer b.bg.Done()
				b.watchReloadFiles(b.cfg.ReloadWatch)
			}()
		}
		if idle, holding := b.cfg.GroupIdleTTL, b.cfg.GroupBacklogTTL; idle > 0 || holding > 0 {
			b.bg.Add(1)
			go func() {
				defer b.bg.Done()
				b.sweepIdleGroups(idle, holding)
			}()
		}
		b.ready.Store(true)
		attrs := []any{"data_dir", b.cfg.DataDir, "fsync", b.cfg.Fsync}
		for _, ln := range b.mqttLns {
			attrs = append(attrs, ln.proto, ln.Address())
		}
		if b.httpLn != nil {
			attrs = append(attrs, "http", b.httpLn.Addr().String())
		}
		b.log.Info("keyline started", attrs...)
	})
	return b.startErr
}

// Run starts the broker, serves until ctx is done, then shuts down within
// the configured shutdown-timeout.
func (b *Broker) Run(ctx context.Context) error {
	if err := b.Start(); err != nil {
		b.closeResources()
		return err
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), b.cfg.ShutdownTimeout)
	defer cancel()
	return b.Shutdown(sctx)
}

// Shutdown stops accepting connections, disconnects clients, commits the
// session state and closes the data file. If ctx ends first it returns
// ctx.Err() while the shutdown goes on in the background.
func (b *Broker) Shutdown(ctx context.Context) error {
	b.stopOnce.Do(func() {
		b.ready.Store(false)
		close(b.stop)
		go func() {
			defer close(b.stopped)
			b.stopErr = b.shutdown()
		}()
	})
	select {
	case <-b.stopped:
		return b.stopErr
	case <-ctx.Done():
		return fmt.Errorf("broker: shutdown: %w", ctx.Err())
	}
}

func (b *Broker) shutdown() error {
	b.log.Info("keyline shutting down")
	if b.ops != nil {
		b.ops.Stop() // ends the topic streams, which the HTTP server would wait for
	}
	if b.started.IsZero() {
		return b.closeResources()
	}
	b.stopBridges() // before the hooks stop: they requeue what is in flight
	if b.cluster != nil {
		// A CONNECT taking a session over from another node would keep the
		// listener's close waiting for release requests (2 s each).
		b.cluster.Stopping()
	}
	// Close disconnects every client, waits for their handlers and stops the
	// hooks (the storage hook commits what is queued).
	_ = b.server.Close()
	err := b.closeResources()
	b.bg.Wait()
	b.log.Info("keyline stopped")
	return err
}

// sendAwayListenerClients disconnects the clients of listener id as the
// broker stops (listener.closeClients), each through sendAway.
func (b *Broker) sendAwayListenerClients(id string) {
	for _, cl := range b.server.Clients.GetByListener(id) {
		if !cl.Closed() {
			b.sendAway(cl)
		}
	}
}

// sendAway ends a client's connection as the broker stops: DISCONNECT 0x8B
// (server shutting down), or, with server-reference set, 0x9C (use another
// server) carrying it to MQTT 5 clients.
func (b *Broker) sendAway(cl *mqtt.Client) {
	if b.cfg.ServerReference == "" || cl.Properties.ProtocolVersion < 5 {
		_ = b.server.DisconnectClient(cl, packets.ErrServerShuttingDown)
		return
	}
	_ = cl.WritePacket(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Disconnect},
		ReasonCode:  packets.ErrUseAnotherServer.Code,
		Properties: packets.Properties{
			ReasonString:    packets.ErrUseAnotherServer.Reason,
			ServerReference: b.cfg.ServerReference,
		},
	})
	cl.Stop(packets.ErrUseAnotherServer)
}

// sweepIdleGroups deletes groups without members: after idle (0: never)
// those that hold nothing, after holding (0: never) those that hold only
// messages, with them.
func (b *Broker) sweepIdleGroups(idle, holding time.Duration) {
	every := time.Minute
	for _, ttl := range []time.Duration{idle, holding} {
		if ttl > 0 {
			every = min(every, sweepInterval(ttl))
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case now := <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			for _, s := range []struct {
				ttl   time.Duration
				sweep func(context.Context, time.Time, time.Duration) ([]string, error)
				level slog.Level
				what  string
			}{
				{idle, b.keyShared.SweepIdle, slog.LevelInfo, "deleted idle group"},
				{holding, b.keyShared.SweepHolding, slog.LevelWarn, "deleted a group without members, with its backlog"},
			} {
				if s.ttl <= 0 {
					continue
				}
				swept, err := s.sweep(ctx, now, s.ttl)
				if err != nil {
					b.log.Warn("sweeping groups without members", "error", err)
				}
				for _, name := range swept {
					b.log.Log(ctx, s.level, s.what, "group", name, "ttl", s.ttl)
				}
			}
			cancel()
		}
	}
}

// groupOwner is whom a client's new groups count against
// (max-groups-per-user): its user when auth is configured, else the host
// part of its address.
func (b *Broker) groupOwner(cl *mqtt.Client) string {
	if b.cfg.Auth != nil && len(cl.Properties.Username) > 0 {
		return "user " + string(cl.Properties.Username)
	}
	host, _, err := net.SplitHostPort(cl.Net.Remote)
	if err != nil {
		host = cl.Net.Remote
	}
	return "address " + host
}

// closeResources closes what New opened, in reverse order.
func (b *Broker) closeResources() error {
	var errs []error
	if b.httpSrv != nil {
		errs = append(errs, ignoreClosed(b.httpSrv.Close()))
	} else if b.httpLn != nil {
		errs = append(errs, ignoreClosed(b.httpLn.Close()))
	}
	if b.started.IsZero() {
		for _, ln := range b.mqttLns {
			errs = append(errs, ignoreClosed(ln.ln.Close()))
		}
	}
	if b.be.close != nil { // nil: the backends were never made
		b.be.close()
	}
	if b.poller != nil {
		errs = append(errs, b.poller.Close()) // after the server: its connections have ended
		b.deadlines.close()
	}
	if b.sessions != nil {
		errs = append(errs, b.sessions.Close())
	}
	if b.db != nil {
		errs = append(errs, b.db.Close())
	}
	return errors.Join(errs...)
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Server returns the underlying mochi server, for tests and embedding.
func (b *Broker) Server() *mqtt.Server { return b.server }

// Addr returns the bound address of a listener: "tcp", "tls", "ws", "wss"
// or "http"; "" when that listener is disabled.
func (b *Broker) Addr(name string) string {
	if name == "http" {
		if b.httpLn == nil {
			return ""
		}
		return b.httpLn.Addr().String()
	}
	for _, ln := range b.mqttLns {
		if ln.id == name {
			return ln.Address()
		}
	}
	return ""
}

// Ready reports whether the broker is serving MQTT and not shutting down
// (and, in cluster mode, is connected to NATS with JetStream available).
// A listener that stopped accepting (an accept error that is not temporary)
// makes it not ready.
func (b *Broker) Ready() bool { return b.NotReady() == nil }

// NotReady says why the broker is not ready, or returns nil when it is.
func (b *Broker) NotReady() error {
	if !b.ready.Load() {
		return errors.New("not serving (starting or shutting down)")
	}
	for _, ln := range b.mqttLns {
		if err := ln.Stopped(); err != nil {
			return err
		}
	}
	if b.be.ready != nil && !b.be.ready() {
		return errors.New("cluster: not connected to NATS with JetStream available")
	}
	return nil
}

// commitInterval maps the commit-interval setting (0: no waiting) to the
// message log's option (0 there selects its default; negative: no waiting).
func commitInterval(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
