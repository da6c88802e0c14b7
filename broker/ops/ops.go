// Package ops is Keyline's operator surface on the HTTP listener: the admin
// API (/api/v1), Prometheus metrics, health checks, the web console's glue
// (package console draws the pages), the HTTP safety checks in front of them
// (Host, token, session cookie, CSRF), the rates and the sampled history of
// the broker's figures, and live topic streams.
//
// It reads the broker only through Broker, which package broker implements
// over mochi, the hooks and the stores: ops imports neither mochi nor the
// stores' implementations, and its tests run on a fake Broker. It may import
// internal/adminapi (the API's types), broker/console, the hooks' group types
// (hooks.GroupStatus and its kin) and persistence's types and errors.
package ops

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/keyline-mq/keyline/broker/console"
	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/adminapi"
	"github.com/keyline-mq/keyline/persistence"
)

// Broker is what the operator surface reads of the broker and asks of it.
// Errors that answer a request are *adminapi.StatusError (an unknown client:
// 404; disconnecting one that is not connected: 409).
type Broker interface {
	// Figures returns the broker's counters and gauges now.
	Figures() Figures
	// Clients lists the clients the broker knows, connected or holding a
	// persistent session, sorted by id.
	Clients() []adminapi.ClientView
	// Client returns one client with its subscriptions and QoS 1/2 messages.
	Client(id string) (adminapi.ClientDetail, error)
	// Disconnect ends a connected client's connection (MQTT 5: DISCONNECT
	// 0x98) and reports whether its session stays.
	Disconnect(id string) (sessionKept bool, err error)
	// Retained returns the retained messages filter matches.
	Retained(filter string) []Message
	// Groups is the Key-Shared groups' admin face (the Key-Shared hook).
	Groups() Groups
	// Bridges returns every bridge's view, in configuration order.
	Bridges() []adminapi.BridgeView
	// NotReady says why the broker does not serve MQTT (/readyz 503 with
	// the reason; keyline_ready 0), or returns nil when it does.
	NotReady() error
}

// Groups is what the operator surface needs of Key-Shared groups.
type Groups interface {
	Groups() ([]hooks.GroupStatus, error)
	Group(name string) (hooks.GroupStatus, error)
	DeleteGroup(ctx context.Context, name string) error
	Members(group string) []string
	MemberInfos(group string) []hooks.MemberInfo
	DeadLetters(group string, after uint64, limit int) ([]persistence.DeadLetterEntry, error)
	DeadLetter(group string, id uint64) (persistence.DeadLetterEntry, error)
	ReplayDeadLetter(group string, id uint64) (uint64, error)
	DeleteDeadLetter(group string, id uint64) error
	PurgeDeadLetters(group string) (int, error)
	Pending(ctx context.Context, group string, limit int) (hooks.GroupStatus, []hooks.PendingMessage, bool, error)
}

// Message is a retained message a topic stream shows.
type Message struct {
	Topic   string
	QoS     byte
	Payload []byte
}

// Figures are the broker's counters (since it started) and gauges.
type Figures struct {
	ClientsConnected, ClientsMaximum int64
	// Sessions counts the clients the broker knows, connected or not.
	Sessions                                        int64
	MessagesReceived, MessagesSent                  int64
	MessagesDropped, InflightDropped                int64
	PacketsReceived, PacketsSent                    int64
	BytesReceived, BytesSent                        int64
	Retained, Inflight, Subscriptions               int64
	SessionCommits, SessionWriteErrors              uint64
	FanoutDeliveries, FanoutEncodes                 uint64
	FanoutTooLarge, FanoutTracked                   uint64
	OutboxResent, OutboxExpired, OutboxStoreRefused uint64
	OutboxQueuedBytes, OutboxColdBytes              int64
	// OutboxSpilledBytes are the queued bytes waiting in data-dir/spill,
	// OutboxSpilled the messages that waited there since start.
	OutboxSpilledBytes                      int64
	OutboxSpilled                           uint64
	ReservedRefused, TakeoversRefused       uint64
	WillsRefused                            uint64
	ConnDroppedMessages, ConnDroppedBytes   uint64
	ConnConflated, ConnDropSignals          uint64
	ConnSlowDisconnects, ConnProtocolErrors uint64
	ConnAbandonedHolds                      uint64
	ConnWrites, ConnFrames                  uint64
	// PollerEvents, PollerRuns and PollerReads are the readiness events,
	// connection handler runs and read system calls of the poller that
	// serves plain TCP connections; PollerWaitersStarted the waiters started
	// beside a handler not yet proven quick, PollerRescues those its
	// watchdog started for a handler that blocked (0 where there is no poller).
	PollerEvents, PollerRuns, PollerReads          uint64
	PollerWaitersStarted, PollerRescues            uint64
	GroupAppendErrors, GroupKeysTooLong            uint64
	GroupSubscriptionsRefused, GroupResultsDropped uint64
	// LogCommits, LogSyncs, LogAppends, LogCommitWaits and LogSparseCommits
	// are the Key-Shared groups' segment log's commits, fdatasyncs, appended
	// messages, commits held back for more appends (commit-interval) and
	// commits not held back because publishes came sparsely; 0 in cluster mode.
	LogCommits, LogSyncs, LogAppends, LogCommitWaits, LogSparseCommits uint64
	// LogResolveCommits counts its commits of resolutions alone;
	// LogWriteTime is the time its commits spent in write and fdatasync.
	LogResolveCommits uint64
	LogWriteTime      time.Duration
	// DataFile is the path of the data file (its size is shown).
	DataFile string
}

// Config configures the operator surface.
type Config struct {
	// Token is the bearer token every route but /metrics, /healthz and
	// /readyz (and the console's login) requires; "": none.
	Token string
	// AllowedHosts are the host names, besides IP addresses and localhost,
	// the listener answers to (DNS rebinding protection).
	AllowedHosts []string
	// TopicReader, when set, says which topics a topic stream may show
	// (canRead nil: every topic); an error refuses the stream (403) with it.
	TopicReader func() (canRead func(topic string) bool, err error)
	// Waiting, when set, is called while a request waits for its token
	// check and returns a function called when it stops waiting (the
	// listener's connection cap lets such a request give way).
	Waiting func(r *http.Request) func()
	// Pprof serves Go's profiler under /debug/pprof/.
	Pprof bool
	// Settings returns group name's dispatcher settings, for its detail.
	Settings func(group string) adminapi.GroupSettingsView
	// Collectors are more metrics to serve (the cluster's, the bridges').
	Collectors []prometheus.Collector
	// Routes, when set, adds more routes (the cluster's, the backup) to the mux.
	Routes func(mux *http.ServeMux)
	// Logger receives the actions operators take and what is refused; nil
	// discards.
	Logger *slog.Logger
}

// Service is the operator surface of one broker.
type Service struct {
	cfg     Config
	b       Broker
	log     *slog.Logger
	started time.Time
	groups  *groupAdmin
	obs     *observer

	startOnce, stopOnce sync.Once
}

// New returns the operator surface of b. Start starts its sampling; Stop
// ends it and every open topic stream.
func New(b Broker, cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Settings == nil {
		cfg.Settings = func(string) adminapi.GroupSettingsView { return adminapi.GroupSettingsView{} }
	}
	s := &Service{cfg: cfg, b: b, log: cfg.Logger, started: time.Now()}
	s.groups = &groupAdmin{s: s, groups: b.Groups()}
	s.obs = newObserver(s)
	s.obs.groupRates = s.groups.sampleRates // the groups page shows rates at the first look
	return s
}

// Start records the start time and starts sampling the broker's figures
// once a second.
func (s *Service) Start() {
	s.startOnce.Do(func() {
		s.started = time.Now()
		s.obs.start()
	})
}

// Stop ends sampling and every topic stream, and waits for them; the HTTP
// server can then shut down without waiting for a stream.
func (s *Service) Stop() { s.stopOnce.Do(s.obs.stop) }

// Watching reports whether a topic stream is open (the observer hook asks
// before every publish).
func (s *Service) Watching() bool { return s.obs.topics.watching() }

// Published shows a publish to the topic streams whose filter matches.
func (s *Service) Published(topic string, qos byte, retain bool, payload []byte) {
	s.obs.topics.publish(topic, qos, retain, payload, time.Now())
}

// minTokenLen is the shortest http-token that gets no warning.
const minTokenLen = 16

// Handler returns the HTTP handler of the operator surface.
func (s *Service) Handler() http.Handler {
	reg := newRegistry(append([]prometheus.Collector{newBrokerCollector(s), newGroupsCollector(s.groups)}, s.cfg.Collectors...)...)
	mux := http.NewServeMux()
	if s.cfg.Pprof {
		registerDebug(mux)
	}
	mux.HandleFunc("GET "+adminapi.PathClients, s.handleClients)
	mux.HandleFunc("GET "+adminapi.PathClients+"/{id}", s.handleClient)
	s.groups.register(mux)
	auth := console.NewAuth(s.cfg.Token)
	auth.Waiting = s.cfg.Waiting
	if n := len(s.cfg.Token); n > 0 && n < minTokenLen {
		s.log.Warn("http-token is short: at the ten guesses a second the HTTP listener answers, it could be guessed; use 16 random characters or more", "length", n)
	}
	s.registerConsole(mux, s.groups, auth)
	s.registerBridges(mux)
	if s.cfg.Routes != nil {
		s.cfg.Routes(mux)
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelError)}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.b.NotReady(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return s.hostCheck(s.adminHandler(mux, auth))
}
