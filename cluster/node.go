package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
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
	lastJSOK     atomic.Int64  // unix nanos of the last successful JetStream call
	stop         chan struct{}
	stopOnce     sync.Once
	wg           sync.WaitGroup
	subs         []*nats.Subscription
	iterators    sync.Mutex
	openIterator []jetstream.MessagesContext
}

// NodeHash is the token that stands for a node id in subjects and names.
func NodeHash(nodeID string) string { return hashToken(nodeID) }

// Start connects to NATS, makes sure the streams and the bucket exist,
// loads the retained messages and starts delivering to h. On error nothing
// is left running.
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
	}
	n.interest.init()
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if n.nc, err = nats.Connect(strings.Join(cfg.URLs, ","), n.natsOptions()...); err != nil {
		return nil, fmt.Errorf("cluster: connect to NATS %s: %w", strings.Join(cfg.URLs, ","), err)
	}
	if n.js, err = jetstream.New(n.nc, jetstream.WithDefaultTimeout(cfg.RequestTimeout)); err != nil {
		return nil, fmt.Errorf("cluster: jetstream: %w", err)
	}
	if err := n.ensureStorage(ctx); err != nil {
		return nil, err
	}
	n.lastJSOK.Store(time.Now().UnixNano())
	last, err := n.LastSequence(ctx)
	if err != nil {
		return nil, err
	}
	n.queuedPos.Store(last) // a node starts with no sessions: older messages are not for it

	for _, s := range []struct {
		subj string
		cb   nats.MsgHandler
	}{{subjRelease + NodeHash(cfg.NodeID), n.onRelease}, {subjAnnounce, n.onAnnounce}, {subjStats + "*", n.onStats}} {
		sub, err := n.nc.Subscribe(s.subj, s.cb)
		if err != nil {
			return nil, fmt.Errorf("cluster: subscribe %s: %w", s.subj, err)
		}
		n.subs = append(n.subs, sub)
	}
	if err := n.nc.FlushTimeout(n.cfg.RequestTimeout); err != nil {
		return nil, fmt.Errorf("cluster: flush: %w", err)
	}
	n.goFunc(n.coreLoop)
	n.goFunc(n.queuedLoop)
	n.goFunc(n.probeLoop)
	if err := n.startRetained(ctx); err != nil {
		return nil, err
	}
	select {
	case <-n.retainedOK:
	case <-ctx.Done():
		return nil, fmt.Errorf("cluster: loading retained messages: %w", ctx.Err())
	}
	n.log.Info("joined cluster", "node", cfg.NodeID, "nats", n.nc.ConnectedUrlRedacted(), "replicas", n.replicas)
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
		nats.ReconnectWait(100 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.Timeout(n.cfg.RequestTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			n.log.Warn("disconnected from NATS", "error", err)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			n.log.Info("reconnected to NATS", "server", c.ConnectedUrlRedacted())
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

// ensureStorage creates or updates the streams and the bucket, with as many
// replicas as the NATS cluster can hold, up to cfg.Replicas.
func (n *Node) ensureStorage(ctx context.Context) error {
	msgs := jetstream.StreamConfig{
		Name:        StreamMessages,
		Description: "Keyline QoS 1/2 messages",
		Subjects:    []string{Prefix + "." + KindQueued + ".>"},
		Retention:   jetstream.LimitsPolicy,
		MaxAge:      n.cfg.QueueMaxAge,
		MaxBytes:    n.cfg.QueueMaxBytes,
		Discard:     jetstream.DiscardOld,
		Storage:     jetstream.FileStorage,
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
		Duplicates:        2 * time.Minute,
		AllowDirect:       true,
	}
	for r := n.cfg.Replicas; r >= 1; r-- {
		msgs.Replicas, retained.Replicas = r, r
		err := n.createStream(ctx, msgs)
		if err == nil {
			err = n.createStream(ctx, retained)
		}
		if err == nil {
			kv, kerr := n.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket:      BucketSessions,
				Description: "Keyline sessions",
				History:     1,
				Storage:     jetstream.FileStorage,
				Replicas:    r,
			})
			if kerr == nil {
				n.kv, n.replicas = kv, r
				if r < n.cfg.Replicas {
					n.log.Warn("the NATS cluster holds fewer JetStream replicas than asked", "asked", n.cfg.Replicas, "replicas", r)
				}
				return nil
			}
			err = kerr
		}
		if !tooFewPeers(err) || r == 1 {
			return fmt.Errorf("cluster: create streams (replicas %d): %w", r, err)
		}
	}
	return nil
}

func (n *Node) createStream(ctx context.Context, cfg jetstream.StreamConfig) error {
	_, err := n.js.CreateOrUpdateStream(ctx, cfg)
	if err != nil {
		return fmt.Errorf("stream %s: %w", cfg.Name, err)
	}
	return nil
}

// tooFewPeers reports whether err says the NATS cluster cannot place that many replicas.
func tooFewPeers(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10005, 10074, 10023: // insufficient resources, replicas > 1 unsupported, no suitable peers
			return true
		}
	}
	s := err.Error()
	return strings.Contains(s, "replicas") || strings.Contains(s, "insufficient resources") || strings.Contains(s, "no suitable peers")
}

// Replicas returns the JetStream replica count in use.
func (n *Node) Replicas() int { return n.replicas }

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
			for _, s := range n.subs {
				_ = s.Unsubscribe()
			}
			n.nc.Close()
		}
		n.wg.Wait()
	})
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
