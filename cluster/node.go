package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// Names of Keyline's streams, bucket and headers.
const (
	StreamMessages = "KL_MSGS"
	StreamRetained = "KL_RETAINED"
	BucketSessions = "KL_SESSIONS"

	hdrNode = "Kl-Node" // the node that published a stored message

	subjAnnounce = Prefix + ".a"  // ownership announcements, to every node
	subjRelease  = Prefix + ".o." // + node hash: "drop this client" requests to one node
	subjStats    = Prefix + ".n." // + node hash: a node's figures, for cluster totals
)

// ErrNotReady is returned while the node has no working JetStream.
var ErrNotReady = errors.New("cluster: NATS or JetStream unavailable")

// Incoming is one message from another node.
type Incoming struct {
	Data   []byte // the body the publishing node handed to Publish
	Seq    uint64 // KL_MSGS or KL_RETAINED sequence; 0 for core NATS
	Queued bool   // came through KL_MSGS (QoS 1/2)
}

// Handler receives what the cluster delivers to a node. Each function is
// called from one goroutine per path (core, queued, retained, ownership),
// in order, and must not block for long.
type Handler struct {
	Message  func(Incoming) // a QoS 0 (core) or 1/2 (queued) message for local subscribers
	Retained func(Incoming) // a retained message (or a delete: the body says), in stream order
	// Release drops the local copy of a client's session if the local copy
	// is at record revision upTo or older: another node is taking it over.
	// It returns once the local connection is closed.
	Release func(clientID string, upTo uint64)
	// NodeStats receives another node's figures (PublishNodeStats).
	NodeStats func(data []byte)
}

// Stats are a node's counters.
type Stats struct {
	CorePublished, QueuedPublished, RetainedStored atomic.Uint64
	CoreReceived, QueuedReceived, RetainedReceived atomic.Uint64
	QueuedOwn                                      atomic.Uint64 // own QoS 1/2 publishes that came back through the consumer (skipped)
	QueuedRedeliver                                atomic.Uint64 // redeliveries of messages already handled (skipped)
	PublishErrors                                  atomic.Uint64
	StoresNotRetried                               atomic.Uint64 // failed QoS 1/2 stores refused rather than retried behind a later one of their publisher
	StoreWindowMax                                 atomic.Uint64 // the most QoS 1/2 stores of one publisher seen in flight at once
	SlowConsumer                                   atomic.Uint64 // core messages NATS dropped because the node fell behind
	ConsumerUpdates                                atomic.Uint64
	Takeovers                                      atomic.Uint64 // sessions this node took from another node
	Released                                       atomic.Uint64 // sessions another node took from this one
}

// Node is one Keyline node's membership in the cluster.
type Node struct {
	cfg      Config
	h        Handler
	log      *slog.Logger
	nc       *nats.Conn
	js       jetstream.JetStream
	kv       jetstream.KeyValue
	replicas int
	queue    string // core queue group: one copy per node
	boot     string // distinguishes this run's message ids from a previous run's
	msgID    atomic.Uint64
	Stats    Stats

	interest     interest
	coreCh       chan *nats.Msg
	queuedPos    atomic.Uint64 // highest KL_MSGS sequence handed to Handler.Message
	retainedPos  atomic.Uint64 // highest KL_RETAINED sequence handed to Handler.Retained
	retainedOK   chan struct{} // closed once the retained stream has been read up to its tail
	retainedOnce sync.Once
	lastJSOK     atomic.Int64  // unix nanos of the last successful JetStream call
	connGen      atomic.Uint64 // bumped on every NATS disconnection
	onReconnect  atomic.Pointer[func()]
	stop         chan struct{}
	storeSlots   chan struct{} // the node's QoS 1/2 stores in flight (publisher.go)
	stopOnce     sync.Once
	wg           sync.WaitGroup
	subs         []*nats.Subscription
	iterators    sync.Mutex
	openIterator []jetstream.MessagesContext
}

// NodeHash is the token that stands for a node id in subjects and names.
func NodeHash(nodeID string) string { return hashToken(nodeID) }

// Start connects to NATS, makes sure the streams and the bucket exist,
// loads the retained messages and starts delivering to h. It waits for
// NATS and JetStream as long as ctx lets it (see ensure.go): a node may
// start before the NATS servers, with them, or while they elect leaders.
// On error nothing is left running, and the error names what never became
// available.
func Start(ctx context.Context, cfg Config, h Handler) (_ *Node, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	n := &Node{
		cfg: cfg, h: h, log: cfg.Logger,
		queue:      "kl-node-" + NodeHash(cfg.NodeID),
		boot:       nuid.Next(),
		coreCh:     make(chan *nats.Msg, 1<<16),
		retainedOK: make(chan struct{}),
		stop:       make(chan struct{}),
		storeSlots: make(chan struct{}, nodeWindow),
	}
	n.interest.init()
	defer func() {
		if err != nil {
			n.Close()
			err = fmt.Errorf("cluster: node %s not started: %w", cfg.NodeID, err)
		}
	}()
	// One connection for the node's life; until a server answers it keeps
	// trying in the background.
	if n.nc, err = nats.Connect(strings.Join(cfg.URLs, ","), n.natsOptions()...); err != nil {
		return nil, fmt.Errorf("connect to NATS %s: %w", strings.Join(cfg.URLs, ","), err)
	}
	if n.js, err = jetstream.New(n.nc, jetstream.WithDefaultTimeout(cfg.RequestTimeout), jetstream.WithPublishAsyncTimeout(cfg.RequestTimeout)); err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	w := newStartWait(n.log)
	if err := n.waitConnected(ctx, w); err != nil {
		return nil, err
	}
	n.replicas = cfg.Replicas
	if n.nc.ConnectedClusterName() == "" && n.replicas > 1 {
		// A NATS server without a cluster holds one replica; a NATS cluster
		// one server short holds as many as asked once that server is up.
		n.log.Warn("the NATS server is not part of a cluster: keyline's streams get one replica", "asked", cfg.Replicas)
		n.replicas = 1
	}
	if err := n.ensureStorage(ctx, w); err != nil {
		return nil, err
	}
	n.lastJSOK.Store(time.Now().UnixNano())
	var last uint64
	if err := n.retryStart(ctx, w, "the last sequence of "+StreamMessages, func(ctx context.Context) (err error) {
		last, err = n.LastSequence(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	n.queuedPos.Store(last) // a node starts with no sessions: older messages are not for it

	for _, s := range []struct {
		subj string
		cb   nats.MsgHandler
	}{{subjRelease + NodeHash(cfg.NodeID), n.onRelease}, {subjAnnounce, n.onAnnounce}, {subjStats + "*", n.onStats}} {
		sub, err := n.nc.Subscribe(s.subj, s.cb)
		if err != nil {
			return nil, fmt.Errorf("subscribe %s: %w", s.subj, err)
		}
		n.subs = append(n.subs, sub)
	}
	if err := n.retryStart(ctx, w, "the node's subscriptions to reach NATS", func(ctx context.Context) error {
		return n.nc.FlushWithContext(ctx)
	}); err != nil {
		return nil, err
	}
	n.goFunc(n.coreLoop)
	n.goFunc(n.queuedLoop)
	n.goFunc(n.probeLoop)
	if err := n.retryStart(ctx, w, "a reader of "+StreamRetained, n.startRetained); err != nil {
		return nil, err
	}
	if err := n.retryStart(ctx, w, "the retained messages", func(ctx context.Context) error {
		select {
		case <-n.retainedOK:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("loading them from %s: %w", StreamRetained, ctx.Err())
		}
	}); err != nil {
		return nil, err
	}
	n.log.Info("joined cluster", "nats", n.nc.ConnectedUrlRedacted(), "replicas", n.replicas,
		"took", time.Since(w.begin).Round(time.Millisecond))
	return n, nil
}

func (n *Node) goFunc(f func()) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		f()
	}()
}

func (n *Node) natsOptions() []nats.Option {
	opts := []nats.Option{
		nats.Name("keyline " + n.cfg.NodeID),
		nats.NoEcho(), // the publishing node delivers locally itself
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true), // a node may start before NATS (see ensure.go)
		nats.ReconnectWait(100 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.Timeout(n.cfg.RequestTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			n.connGen.Add(1) // fences every group lease until its next renewal
			n.log.Warn("disconnected from NATS", "error", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			n.log.Info("reconnected to NATS", "server", c.ConnectedUrlRedacted())
			if f := n.onReconnect.Load(); f != nil {
				(*f)()
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				n.Stats.SlowConsumer.Add(1)
				return
			}
			n.log.Warn("NATS error", "error", err)
		}),
	}
	if n.cfg.Creds != "" {
		opts = append(opts, nats.UserCredentials(n.cfg.Creds))
	}
	if n.cfg.TLSCert != "" || n.cfg.TLSCA != "" {
		// TLS 1.2 at least; the certificate and CA below are loaded by callbacks.
		opts = append(opts, nats.Secure(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	if n.cfg.TLSCert != "" {
		opts = append(opts, nats.ClientCert(n.cfg.TLSCert, n.cfg.TLSKey))
	}
	if n.cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(n.cfg.TLSCA))
	}
	return opts
}

// ensureStorage makes the streams and the bucket, all at once, with
// n.replicas replicas.
func (n *Node) ensureStorage(ctx context.Context, w *startWait) error {
	msgs := jetstream.StreamConfig{
		Name:        StreamMessages,
		Description: "Keyline QoS 1/2 messages",
		Subjects:    []string{Prefix + "." + KindQueued + ".>"},
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      n.cfg.QueueMaxAge,
		MaxBytes:    n.cfg.QueueMaxBytes,
		Discard:     jetstream.DiscardOld,
		Storage:     jetstream.FileStorage,
		Replicas:    n.replicas,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
	}
	retained := jetstream.StreamConfig{
		Name:              StreamRetained,
		Description:       "Keyline retained messages",
		Subjects:          []string{Prefix + "." + KindRetained + ".>"},
		Retention:         jetstream.LimitsPolicy,
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardOld,
		Storage:           jetstream.FileStorage,
		Replicas:          n.replicas,
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, f := range []func() error{
		func() error { return n.ensureStream(ctx, w, msgs) },
		func() error { return n.ensureStream(ctx, w, retained) },
		func() (err error) {
			n.kv, err = n.ensureBucket(ctx, w, jetstream.KeyValueConfig{
				Bucket: BucketSessions, Description: "Keyline sessions",
				History: 1, Storage: jetstream.FileStorage, Replicas: n.replicas,
			})
			return err
		},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f()
		}()
	}
	wg.Wait()
	return joinLine(errs...)
}

// joinLine joins the errors that are not nil on one line.
func joinLine(errs ...error) error {
	var msgs []string
	var first error
	for _, err := range errs {
		if err != nil {
			if first == nil {
				first = err
			}
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) <= 1 {
		return first
	}
	return fmt.Errorf("%w (and: %s)", first, strings.Join(msgs[1:], "; "))
}

// Replicas returns the JetStream replica count in use.
func (n *Node) Replicas() int { return n.replicas }

// URLs returns the NATS servers the node was given.
func (n *Node) URLs() []string { return slices.Clone(n.cfg.URLs) }

// NodeID returns the node's id.
func (n *Node) NodeID() string { return n.cfg.NodeID }

// Ready reports whether the node is connected to NATS and JetStream
// answered within the last ten seconds (a NATS leader election takes up to
// about eight).
func (n *Node) Ready() bool {
	select {
	case <-n.stop:
		return false
	case <-n.retainedOK:
	default:
		return false
	}
	return n.nc.IsConnected() && time.Since(time.Unix(0, n.lastJSOK.Load())) < 10*time.Second
}

// probeLoop checks JetStream once a second.
func (n *Node) probeLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
		}
		if !n.nc.IsConnected() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.RequestTimeout)
		_, err := n.js.AccountInfo(ctx)
		cancel()
		if err == nil {
			n.lastJSOK.Store(time.Now().UnixNano())
		}
	}
}

// Close leaves the cluster: it stops every loop and closes the connection.
func (n *Node) Close() {
	n.stopOnce.Do(func() {
		close(n.stop)
		n.iterators.Lock()
		for _, it := range n.openIterator {
			it.Stop()
		}
		n.openIterator = nil
		n.iterators.Unlock()
		if n.nc != nil {
			n.drainSubs()
			n.nc.Close()
		}
		n.wg.Wait()
	})
}

// closeDrainTimeout bounds how long Close waits for the handlers of
// requests that had reached the node.
const closeDrainTimeout = 5 * time.Second

// drainSubs ends the node's subscriptions once the requests they had taken
// in are handled, before Close closes the connection: a release request
// being answered writes the session's last progress and replies. Closed
// under it, the write failed ("nats: connection closed") and the
// requesting node waited RequestTimeout for an answer that never came.
func (n *Node) drainSubs() {
	var closed []<-chan nats.SubStatus
	for _, s := range n.subs {
		ch := s.StatusChanged(nats.SubscriptionClosed)
		if err := s.Drain(); err != nil {
			_ = s.Unsubscribe()
			continue
		}
		closed = append(closed, ch)
	}
	t := time.NewTimer(closeDrainTimeout)
	defer t.Stop()
	for _, ch := range closed {
		select {
		case <-ch:
		case <-t.C:
			n.log.Warn("closing the NATS connection with requests still being handled", "waited", closeDrainTimeout)
			return
		}
	}
}

func (n *Node) trackIterator(it jetstream.MessagesContext) bool {
	n.iterators.Lock()
	defer n.iterators.Unlock()
	select {
	case <-n.stop:
		it.Stop()
		return false
	default:
	}
	n.openIterator = append(n.openIterator, it)
	return true
}

func (n *Node) untrackIterator(it jetstream.MessagesContext) {
	n.iterators.Lock()
	defer n.iterators.Unlock()
	for i, o := range n.openIterator {
		if o == it {
			n.openIterator = append(n.openIterator[:i], n.openIterator[i+1:]...)
			return
		}
	}
}

func (n *Node) stopped() bool {
	select {
	case <-n.stop:
		return true
	default:
		return false
	}
}

// sleep waits d or until Close; it reports whether the node is still running.
func (n *Node) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-n.stop:
		return false
	case <-t.C:
		return true
	}
}

// PublishNodeStats sends this node's figures to every other node.
func (n *Node) PublishNodeStats(data []byte) error {
	return n.nc.Publish(subjStats+NodeHash(n.cfg.NodeID), data)
}

func (n *Node) onStats(m *nats.Msg) {
	if n.h.NodeStats != nil {
		n.h.NodeStats(m.Data)
	}
}
