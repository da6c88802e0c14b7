package broker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"gopkg.in/yaml.v3"

	"github.com/keyline-mq/keyline/internal/connq"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// ErrInvalidConfig wraps every error Validate and LoadConfigFile return.
var ErrInvalidConfig = errors.New("invalid configuration")

// Config is everything a broker needs to run. Each field's YAML key is the
// name of the command-line flag that sets it, so a config file and the flags
// speak the same language. Start from DefaultConfig.
type Config struct {
	// Listeners. An empty address disables the listener.
	TCP     string `yaml:"tcp"`      // MQTT over TCP
	WS      string `yaml:"ws"`       // MQTT over WebSocket (path /)
	TLS     string `yaml:"tls"`      // MQTT over TLS
	TLSCert string `yaml:"tls-cert"` // PEM certificate (chain) for the TLS listener
	TLSKey  string `yaml:"tls-key"`  // PEM private key for the TLS listener
	HTTP    string `yaml:"http"`     // metrics, health and admin API

	// Storage.
	DataDir string `yaml:"data-dir"` // directory of the bbolt file
	Fsync   bool   `yaml:"fsync"`    // fsync every commit (off: survives a process crash, not a power loss)
	// SegmentSize is the size of each file of the group message log.
	SegmentSize ByteSize `yaml:"segment-size"`
	// CommitInterval is the longest a QoS 1/2 publish to a Key-Shared group
	// waits for others to share its commit (write and fdatasync) of the
	// group message log: commits go early once they hold the publishes their
	// publishers have in flight, or CommitMinAppends, and at once while
	// publishes come more than half a commit's time apart (negative: no waiting).
	CommitInterval   time.Duration `yaml:"commit-interval"`
	CommitMinAppends int           `yaml:"commit-min-appends"`

	// Logs.
	LogLevel  LogLevel  `yaml:"log-level"`  // debug, info, warn, error
	LogFormat LogFormat `yaml:"log-format"` // text or json

	// MQTT limits.
	MaxPacketSize uint32 `yaml:"max-packet-size"` // bytes; larger packets close the connection (0: no limit)
	MaxClients    int64  `yaml:"max-clients"`     // connected clients at once (0: no limit); DefaultMaxClients by default
	MaxInflight   uint16 `yaml:"max-inflight"`    // QoS 1/2 messages held per session (queued or unacknowledged)
	// MaxSessionQueueBytes and MaxQueuedBytes bound the same messages in
	// bytes, per session and for all sessions together (0: no bound).
	MaxSessionQueueBytes ByteSize `yaml:"max-session-queue-bytes"`
	MaxQueuedBytes       ByteSize `yaml:"max-queued-bytes"`
	// SpillAfter is how many bytes of frames of QoS 1/2 messages a session
	// keeps in memory; the frames of those it holds beyond wait in
	// data-dir/spill until its client reads them (0: all in memory).
	SpillAfter     ByteSize `yaml:"spill-after"`
	ReceiveMaximum uint16   `yaml:"receive-maximum"` // QoS 1/2 publishes a client may have unacknowledged towards the broker
	// MaxSessionExpiry caps how long a disconnected persistent session is
	// kept, and is how long an MQTT 3.1.1 session (clean session 0) is kept;
	// 0: no cap, and 3.1.1 sessions never expire.
	MaxSessionExpiry time.Duration `yaml:"max-session-expiry"`
	MaxMessageExpiry time.Duration `yaml:"max-message-expiry"` // drop retained and queued messages older than this (0: keep)
	// TopicAliasMaximum is the Topic Alias Maximum offered to MQTT 5
	// clients in CONNACK: how many inbound aliases a connection may set (0:
	// none). TopicAliasBytes bounds the bytes of topics they hold (0: no
	// limit); a publish past either is answered DISCONNECT 0x94 or 0x97.
	TopicAliasMaximum uint16   `yaml:"topic-alias-maximum"`
	TopicAliasBytes   ByteSize `yaml:"topic-alias-bytes"`
	// MaxTopicLevels bounds the levels of a topic a client publishes to (or
	// names in its will) and of a filter it subscribes to (0: no limit).
	MaxTopicLevels int `yaml:"max-topic-levels"`
	// MaxClientID bounds the bytes of a client id (CONNACK 0x85, 3.1.1:
	// 0x02); at most MaxStorableClientID, what the session store can key.
	MaxClientID ByteSize `yaml:"max-client-id"`
	// MaxSubscriptionsPerClient and MaxSubscriptions bound the subscriptions
	// one client, and all clients together, may hold (SUBACK 0x97; 0: no
	// limit).
	MaxSubscriptionsPerClient int   `yaml:"max-subscriptions-per-client"`
	MaxSubscriptions          int64 `yaml:"max-subscriptions"`
	// MaxKeepAlive is the longest keep alive an MQTT 5 client may use: one
	// that asks for more, or for none, is told this one in its CONNACK
	// (Server Keep Alive). 0: clients keep their own. Whole seconds.
	MaxKeepAlive    time.Duration `yaml:"max-keep-alive"`
	ShutdownTimeout time.Duration `yaml:"shutdown-timeout"` // bound on a graceful shutdown
	// ServerReference, when set, is where MQTT 5 clients are sent when this
	// node shuts down: DISCONNECT 0x9C (use another server) with it as the
	// Server Reference, in place of 0x8B (server shutting down). A rolling
	// restart of a cluster names another node, or a load balancer, here.
	ServerReference string `yaml:"server-reference"`

	// Fan-out: every connection's outbound queue (see package connq).
	SlowPolicy         connq.Policy        `yaml:"slow-policy"`          // drop-oldest, drop-newest, disconnect or conflate, for QoS 0 frames that do not fit
	ConnQueueSoft      ByteSize            `yaml:"conn-queue-soft"`      // may be exceeded for conn-queue-grace
	ConnQueueHard      ByteSize            `yaml:"conn-queue-hard"`      // never exceeded; frames mochi writes past it cut the client
	ConnQueueGrace     time.Duration       `yaml:"conn-queue-grace"`     // how long a queue may stay above the soft limit
	ConnQueueOverrides []ConnQueueOverride `yaml:"conn-queue-overrides"` // per listener / client-id prefix; config file only

	// Key-Shared dispatch of $share/<group>/<filter> subscriptions.
	KeyProperty string   `yaml:"key-property"` // MQTT 5 user property holding the routing key
	MaxKeySize  ByteSize `yaml:"max-key-size"` // longest routing key accepted (0: no limit)
	MaxGroups   int      `yaml:"max-groups"`   // most groups (0: no limit)
	// MaxGroupsPerClient bounds the groups one client may be a member of (0: no limit).
	MaxGroupsPerClient int `yaml:"max-groups-per-client"`
	// MaxGroupsPerUser bounds the running groups the clients of one user
	// (with auth; else of one address) have created (0: no limit).
	MaxGroupsPerUser int `yaml:"max-groups-per-user"`
	// GroupBacklogTTL deletes a group that has had no members for this long
	// and holds messages (not dead letters), with them; 0: never.
	GroupBacklogTTL time.Duration    `yaml:"group-backlog-ttl"`
	GroupSettings   `yaml:",inline"` // defaults for every group
	GroupIdleTTL    time.Duration    `yaml:"group-idle-ttl"`  // delete a group (and its backlog) after this long without members; 0: never
	GroupOverrides  []GroupOverride  `yaml:"group-overrides"` // per group or share name; config file only
	HTTPToken       string           `yaml:"http-token"`      // bearer token the admin API requires; empty: none
	// HTTPAllowedHosts are the host names (besides IP addresses and
	// localhost) the HTTP listener answers to.
	HTTPAllowedHosts []string `yaml:"http-allowed-hosts"`
	// HTTPReadTimeout bounds reading one HTTP request, body included.
	HTTPReadTimeout time.Duration `yaml:"http-read-timeout"`
	// HTTPMaxConns bounds the HTTP connections served at once.
	HTTPMaxConns int `yaml:"http-max-conns"`
	// HTTPTopicUser names the auth ledger's user whose read ACL the topic
	// stream (console Topics page) applies; without it, and with a ledger,
	// the stream needs the http token (whose holder sees every topic).
	HTTPTopicUser string `yaml:"http-topic-user"`
	// HTTPMaxConnsPerAddress bounds those of one client address (0: no
	// bound beyond HTTPMaxConns).
	HTTPMaxConnsPerAddress int `yaml:"http-max-conns-per-address"`
	// Pprof serves Go's profiler under /debug/pprof/ (behind the token).
	Pprof bool `yaml:"pprof"`
	// WSAllowedOrigins are the browser origins (besides the listener's own
	// host) a WebSocket connection may come from; "*": any.
	WSAllowedOrigins []string `yaml:"ws-allowed-origins"`

	// SessionOwnership says what a CONNECT gets that uses a client id whose
	// session another username holds (with auth configured): refused, or a
	// fresh session (the other user's is discarded).
	SessionOwnership SessionOwnership `yaml:"session-ownership"`

	// Cluster mode over NATS JetStream (broker/cluster.go); off without nats.
	Cluster ClusterConfig `yaml:",inline"`

	// Device identity: client certificates, password file (broker/identity_config.go).
	IdentityConfig `yaml:",inline"`
	// Rate limits (broker/ratelimit.go).
	RateLimits RateLimitConfig `yaml:",inline"`

	// Bridges to other MQTT brokers (broker/bridges.go).
	Bridges []BridgeConfig `yaml:"bridges"`

	// Auth is a mochi auth ledger (users, auth rules, ACL rules). Nil allows
	// every client to connect, publish and subscribe. Config file only.
	Auth *auth.Ledger `yaml:"auth"`
}

// GroupSettings tune Key-Shared dispatch and storage of a group.
type GroupSettings struct {
	AckTimeout         time.Duration           `yaml:"ack-timeout"`          // time a member has to acknowledge before the message is retried
	MaxDeliveries      int                     `yaml:"max-deliveries"`       // failed attempts before the poison policy applies
	PoisonPolicy       keyshared.PoisonPolicy  `yaml:"poison-policy"`        // dead-letter, drop or block
	RetryBackoff       []time.Duration         `yaml:"retry-backoff"`        // base[, max] delay before a retry, doubling per attempt
	MemberMaxInflight  int                     `yaml:"member-max-inflight"`  // messages in flight per member (its Receive Maximum lowers it)
	Window             int                     `yaml:"window"`               // messages in flight plus blocked per group
	WindowBytes        ByteSize                `yaml:"window-bytes"`         // bytes of those messages per group
	BacklogMaxMessages uint64                  `yaml:"backlog-max-messages"` // unresolved messages a group keeps; 0: no limit
	BacklogMaxBytes    ByteSize                `yaml:"backlog-max-bytes"`    // unresolved bytes a group keeps; 0: no limit
	BacklogPolicy      keyshared.BacklogPolicy `yaml:"backlog-policy"`       // reject (MQTT 5 PUBACK 0x97) or drop-oldest, at a backlog limit
}

// GroupOverride changes the settings of the groups it names: Group is a full
// group name "<share>/<filter>" (e.g. "workers/orders/#"), Share a share
// name (every group of it). The first match applies; unset (zero) fields keep
// the global values.
type GroupOverride struct {
	Group         string `yaml:"group"`
	Share         string `yaml:"share"`
	GroupSettings `yaml:",inline"`
}

// ConnQueueOverride changes the queue settings of the connections it
// matches: those on Listener ("tcp", "tls", "ws" or "wss"; empty: any) whose client
// id starts with ClientPrefix (empty: any). The first matching override
// applies; its unset (zero) fields keep the global values.
type ConnQueueOverride struct {
	Listener       string        `yaml:"listener"`
	ClientPrefix   string        `yaml:"client-prefix"`
	SlowPolicy     connq.Policy  `yaml:"slow-policy"`
	ConnQueueSoft  ByteSize      `yaml:"conn-queue-soft"`
	ConnQueueHard  ByteSize      `yaml:"conn-queue-hard"`
	ConnQueueGrace time.Duration `yaml:"conn-queue-grace"`
}

// DefaultTopicAliasMaximum and DefaultTopicAliasBytes bound one
// connection's inbound topic aliases: as many as mosquitto's default (10)
// and then some, and 64 KiB of topics (16 topics of 4 KiB).
const (
	DefaultTopicAliasMaximum = 16
	DefaultTopicAliasBytes   = 64 << 10
)

// DefaultMaxTopicLevels is the most levels a client's topic or filter may
// have unless configured: EMQX's default, far above what real topic schemes
// use (AWS IoT allows 8, Sparkplug B uses 5), and a small bound on what a
// topic walk costs.
const DefaultMaxTopicLevels = 128

// DefaultMaxSubscriptionsPerClient and DefaultMaxSubscriptions bound
// subscriptions unless configured. A subscription costs about 1.2 KiB (topic
// index, session, fan-out routes; more with a persistent session's stored
// copy), so the global default holds about 1.2 GiB; a dashboard that watches
// a thousand topics one by one still fits in one client's share.
const (
	DefaultMaxSubscriptionsPerClient = 1000
	DefaultMaxSubscriptions          = 1_000_000
)

// DefaultMaxClientID is the longest client id accepted unless configured:
// eight times what AWS IoT and Azure IoT Hub allow (128), room for the
// longest naming schemes in use (Google's projects/.../devices/... paths),
// and far below MaxStorableClientID.
const DefaultMaxClientID = 1 << 10

// MaxStorableClientID is the longest client id whose session the store can
// key: bbolt's keys are at most 32 KiB, and a session's keys hold the id and
// a filter or packet id.
const MaxStorableClientID = 16 << 10

// DefaultMaxSessionExpiry is how long a disconnected persistent session is
// kept unless configured: a week, so devices offline over a long weekend
// keep their sessions and abandoned ones do not pile up for ever.
const DefaultMaxSessionExpiry = 7 * 24 * time.Hour

// FDReserve is how many file descriptors the default max-clients leaves for
// everything but clients: the data file and segment files, HTTP connections
// (http-max-conns, 256 by default), NATS, and connections accepted but not
// yet past their CONNECT.
const FDReserve = 512

// DefaultMaxClients is the default max-clients: the open-files limit minus
// FDReserve (at least half the limit), so that a broker near its limit
// refuses new clients with a CONNACK (0x89; 3.1.1: 0x03) instead of failing
// to accept connections (and, with them, HTTP requests and files). 0 (no
// limit) when the open-files limit is unknown.
func DefaultMaxClients() int64 {
	n := openFilesLimit()
	if n <= 0 {
		return 0
	}
	return max(n/2, n-FDReserve)
}

// DefaultConfig returns the configuration `keyline` runs with when given nothing.
func DefaultConfig() Config {
	return Config{
		TCP:              ":1883",
		HTTP:             "127.0.0.1:9883",
		DataDir:          "./data",
		Fsync:            true,
		SegmentSize:      persistence.DefaultSegmentSize,
		CommitInterval:   persistence.DefaultCommitInterval,
		CommitMinAppends: 1,
		LogLevel:         LogInfo,
		LogFormat:        LogText,
		MaxPacketSize:    1 << 20,
		MaxClients:       DefaultMaxClients(),
		MaxInflight:      8192,
		RateLimits:       RateLimitConfig{ConnectRatePerAddress: DefaultConnectRatePerAddress},
		// A session's QoS 1/2 messages wait in memory while it is away; 8192
		// of up to max-packet-size each would be 8 GiB.
		MaxSessionQueueBytes:      64 << 20,
		SpillAfter:                1 << 20,
		MaxQueuedBytes:            1 << 30,
		ReceiveMaximum:            1024,
		TopicAliasMaximum:         DefaultTopicAliasMaximum,
		TopicAliasBytes:           DefaultTopicAliasBytes,
		MaxTopicLevels:            DefaultMaxTopicLevels,
		MaxClientID:               DefaultMaxClientID,
		MaxSubscriptionsPerClient: DefaultMaxSubscriptionsPerClient,
		MaxSubscriptions:          DefaultMaxSubscriptions,
		MaxSessionExpiry:          DefaultMaxSessionExpiry,
		ShutdownTimeout:           10 * time.Second,
		SlowPolicy:                connq.DropOldest,
		ConnQueueSoft:             1 << 20,
		ConnQueueHard:             8 << 20,
		ConnQueueGrace:            10 * time.Second,
		KeyProperty:               "key",
		MaxKeySize:                1 << 10,
		MaxGroups:                 10_000,
		MaxGroupsPerClient:        100,
		MaxGroupsPerUser:          1000,
		GroupBacklogTTL:           DefaultMaxSessionExpiry,
		GroupIdleTTL:              time.Hour,
		SessionOwnership:          OwnershipRefuse,
		HTTPReadTimeout:           10 * time.Second,
		HTTPMaxConns:              256,
		HTTPMaxConnsPerAddress:    64,
		Cluster:                   DefaultClusterConfig(),
		IdentityConfig:            DefaultIdentityConfig(),
		GroupSettings: GroupSettings{
			AckTimeout:        30 * time.Second,
			MaxDeliveries:     5,
			PoisonPolicy:      keyshared.PoisonDeadLetter,
			RetryBackoff:      []time.Duration{time.Second, time.Minute},
			MemberMaxInflight: 1000,
			Window:            10000,
			WindowBytes:       8 << 20,
			// A group keeps every matching message until a member resolves
			// it, also while it has none: bound what one can hold.
			BacklogMaxMessages: DefaultBacklogMaxMessages,
			BacklogMaxBytes:    DefaultBacklogMaxBytes,
			BacklogPolicy:      keyshared.PolicyReject,
		},
	}
}

// Default backlog limits of a group (backlog-max-messages, backlog-max-bytes).
const (
	DefaultBacklogMaxMessages = 1_000_000
	DefaultBacklogMaxBytes    = 1 << 30
)

func checkAddr(name, addr string) error {
	if addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%w: %s %q is not a host:port address (for example :1883 or 127.0.0.1:1883)", ErrInvalidConfig, name, addr)
	}
	return nil
}

// Validate reports the first problem with c, naming the setting at fault.
func (c *Config) Validate() error {
	if c.TCP == "" && c.WS == "" && c.TLS == "" && c.WSS == "" {
		return fmt.Errorf("%w: no MQTT listener: set at least one of tcp, ws, tls, wss", ErrInvalidConfig)
	}
	seen := map[string]string{}
	for _, l := range []struct{ name, addr string }{{"tcp", c.TCP}, {"ws", c.WS}, {"tls", c.TLS}, {"wss", c.WSS}, {"http", c.HTTP}} {
		if err := checkAddr(l.name, l.addr); err != nil {
			return err
		}
		if l.addr == "" || strings.HasSuffix(l.addr, ":0") { // port 0: the kernel picks distinct ports
			continue
		}
		if other, dup := seen[l.addr]; dup {
			return fmt.Errorf("%w: %s and %s both use address %q", ErrInvalidConfig, other, l.name, l.addr)
		}
		seen[l.addr] = l.name
	}
	switch {
	case c.TLS != "" && (c.TLSCert == "" || c.TLSKey == ""):
		return fmt.Errorf("%w: tls needs both tls-cert and tls-key", ErrInvalidConfig)
	case c.WSS != "" && (c.TLSCert == "" || c.TLSKey == ""):
		return fmt.Errorf("%w: wss needs both tls-cert and tls-key", ErrInvalidConfig)
	case c.TLS == "" && c.WSS == "" && (c.TLSCert != "" || c.TLSKey != ""):
		return fmt.Errorf("%w: tls-cert and tls-key need a tls or wss listener address", ErrInvalidConfig)
	case c.DataDir == "":
		return fmt.Errorf("%w: data-dir is empty", ErrInvalidConfig)
	case c.SegmentSize < 64<<10 || c.SegmentSize > 1<<30:
		return fmt.Errorf("%w: segment-size %v is not between 64KiB and 1GiB", ErrInvalidConfig, c.SegmentSize)
	case c.CommitInterval < 0 || c.CommitInterval > time.Second:
		return fmt.Errorf("%w: commit-interval %v is not between 0 and 1s (a publish waits up to that long for its acknowledgement)", ErrInvalidConfig, c.CommitInterval)
	case c.CommitMinAppends < 1 || c.CommitMinAppends > 8192:
		return fmt.Errorf("%w: commit-min-appends %d is not between 1 and 8192", ErrInvalidConfig, c.CommitMinAppends)
	case c.MaxInflight == 0:
		return fmt.Errorf("%w: max-inflight must be at least 1", ErrInvalidConfig)
	case c.SpillAfter < 0:
		return fmt.Errorf("%w: spill-after %v is negative", ErrInvalidConfig, c.SpillAfter)
	case c.MaxSessionQueueBytes < 0 || c.MaxQueuedBytes < 0:
		return fmt.Errorf("%w: max-session-queue-bytes and max-queued-bytes must not be negative", ErrInvalidConfig)
	case c.ReceiveMaximum == 0:
		return fmt.Errorf("%w: receive-maximum must be at least 1", ErrInvalidConfig)
	case c.MaxClients < 0:
		return fmt.Errorf("%w: max-clients must not be negative", ErrInvalidConfig)
	case c.MaxSessionExpiry < 0 || c.MaxSessionExpiry > time.Duration(1<<32-1)*time.Second:
		return fmt.Errorf("%w: max-session-expiry must be between 0 and 4294967295s", ErrInvalidConfig)
	case c.MaxMessageExpiry < 0:
		return fmt.Errorf("%w: max-message-expiry must not be negative", ErrInvalidConfig)
	case len(c.ServerReference) > 65535 || !utf8.ValidString(c.ServerReference) || strings.ContainsRune(c.ServerReference, 0):
		return fmt.Errorf("%w: server-reference must be UTF-8 without NUL, at most 65535 bytes", ErrInvalidConfig)
	case c.MaxClientID < 23 || c.MaxClientID > MaxStorableClientID:
		return fmt.Errorf("%w: max-client-id must be between 23 bytes (what MQTT requires every server to take) and %v", ErrInvalidConfig, ByteSize(MaxStorableClientID))
	case c.MaxSubscriptionsPerClient < 0 || c.MaxSubscriptions < 0:
		return fmt.Errorf("%w: max-subscriptions-per-client and max-subscriptions must not be negative", ErrInvalidConfig)
	case c.MaxTopicLevels < 0:
		return fmt.Errorf("%w: max-topic-levels must not be negative", ErrInvalidConfig)
	case c.TopicAliasBytes < 0 || c.TopicAliasBytes > 1<<30:
		return fmt.Errorf("%w: topic-alias-bytes must be between 0 and 1GiB", ErrInvalidConfig)
	case c.MaxKeepAlive < 0 || c.MaxKeepAlive > 65535*time.Second || c.MaxKeepAlive%time.Second != 0:
		return fmt.Errorf("%w: max-keep-alive must be whole seconds between 0 and 65535s", ErrInvalidConfig)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("%w: shutdown-timeout must be positive", ErrInvalidConfig)
	case c.HTTPReadTimeout <= 0:
		return fmt.Errorf("%w: http-read-timeout must be positive", ErrInvalidConfig)
	case c.HTTPMaxConns < 1:
		return fmt.Errorf("%w: http-max-conns must be at least 1", ErrInvalidConfig)
	case c.HTTPTopicUser != "" && c.Auth == nil:
		return fmt.Errorf("%w: http-topic-user %q needs an auth section (it names a user of the ledger)", ErrInvalidConfig, c.HTTPTopicUser)
	case c.HTTPMaxConnsPerAddress < 0:
		return fmt.Errorf("%w: http-max-conns-per-address must not be negative", ErrInvalidConfig)
	case c.SessionOwnership == 0:
		return fmt.Errorf("%w: session-ownership is not set (want %s)", ErrInvalidConfig, SessionOwnerships)
	case c.KeyProperty == "":
		return fmt.Errorf("%w: key-property is empty", ErrInvalidConfig)
	case c.MaxKeySize < 0 || c.MaxKeySize > 65535:
		return fmt.Errorf("%w: max-key-size must be between 0 and 65535 bytes", ErrInvalidConfig)
	case c.MaxGroups < 0 || c.MaxGroupsPerClient < 0 || c.MaxGroupsPerUser < 0:
		return fmt.Errorf("%w: max-groups, max-groups-per-client and max-groups-per-user must not be negative", ErrInvalidConfig)
	case c.GroupBacklogTTL < 0:
		return fmt.Errorf("%w: group-backlog-ttl must not be negative", ErrInvalidConfig)
	case c.GroupIdleTTL < 0:
		return fmt.Errorf("%w: group-idle-ttl must not be negative", ErrInvalidConfig)
	}
	if _, _, err := c.groupSettings(""); err != nil {
		return err
	}
	for i, o := range c.GroupOverrides {
		if (o.Group == "") == (o.Share == "") {
			return fmt.Errorf("%w: group-overrides[%d]: set exactly one of group and share", ErrInvalidConfig, i)
		}
		name := o.Group
		if name == "" {
			name = o.Share + "/#"
		}
		if _, _, err := c.groupSettings(name); err != nil {
			return fmt.Errorf("group-overrides[%d]: %w", i, err)
		}
	}
	if _, err := c.connLimits("", ""); err != nil {
		return err
	}
	for i, o := range c.ConnQueueOverrides {
		if o.Listener != "" && o.Listener != "tcp" && o.Listener != "tls" && o.Listener != "ws" && o.Listener != "wss" {
			return fmt.Errorf("%w: conn-queue-overrides[%d]: listener %q is not one of tcp, tls, ws, wss", ErrInvalidConfig, i, o.Listener)
		}
		if _, err := c.connLimits(o.Listener, o.ClientPrefix); err != nil {
			return fmt.Errorf("conn-queue-overrides[%d]: %w", i, err)
		}
	}
	if err := c.Cluster.validate(); err != nil {
		return err
	}
	if err := c.validateIdentity(); err != nil {
		return err
	}
	if err := c.RateLimits.validate(c.authRequired()); err != nil {
		return err
	}
	if err := c.validateBridges(); err != nil {
		return err
	}
	switch {
	case c.LogLevel == 0:
		return fmt.Errorf("%w: log-level is not set (want %s)", ErrInvalidConfig, LogLevels)
	case c.LogFormat == 0:
		return fmt.Errorf("%w: log-format is not set (want %s)", ErrInvalidConfig, LogFormats)
	}
	return nil
}

// connLimits resolves the queue limits of a connection on listener whose
// client id is clientID ("" before CONNECT).
func (c *Config) connLimits(listener, clientID string) (connq.Limits, error) {
	policy, soft, hard, grace := c.SlowPolicy, c.ConnQueueSoft, c.ConnQueueHard, c.ConnQueueGrace
	for _, o := range c.ConnQueueOverrides {
		if (o.Listener != "" && o.Listener != listener) || !strings.HasPrefix(clientID, o.ClientPrefix) {
			continue
		}
		if o.ClientPrefix != "" && clientID == "" {
			continue
		}
		if o.SlowPolicy != 0 {
			policy = o.SlowPolicy
		}
		if o.ConnQueueSoft != 0 {
			soft = o.ConnQueueSoft
		}
		if o.ConnQueueHard != 0 {
			hard = o.ConnQueueHard
		}
		if o.ConnQueueGrace != 0 {
			grace = o.ConnQueueGrace
		}
		break
	}
	switch {
	case policy == 0:
		return connq.Limits{}, fmt.Errorf("%w: slow-policy is not set (want %s)", ErrInvalidConfig, connq.Policies)
	case hard <= 0:
		return connq.Limits{}, fmt.Errorf("%w: conn-queue-hard must be positive", ErrInvalidConfig)
	case soft < 0 || soft > hard:
		return connq.Limits{}, fmt.Errorf("%w: conn-queue-soft (%v) must be between 0 and conn-queue-hard (%v)", ErrInvalidConfig, soft, hard)
	case c.MaxPacketSize > 0 && int64(hard) < int64(c.MaxPacketSize):
		return connq.Limits{}, fmt.Errorf("%w: conn-queue-hard (%v) is below max-packet-size (%v): one packet could never be sent", ErrInvalidConfig, hard, ByteSize(c.MaxPacketSize))
	case grace < 0:
		return connq.Limits{}, fmt.Errorf("%w: conn-queue-grace must not be negative", ErrInvalidConfig)
	}
	return connq.Limits{Soft: int(soft), Hard: int(hard), Grace: grace, Policy: policy}, nil
}

// LoadConfigFile reads a YAML config file into c, over the values c already
// holds. Unknown keys are an error.
func LoadConfigFile(path string, c *Config) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("%w: read %s: %v", ErrInvalidConfig, path, err)
	}
	if err := DecodeConfig(data, c); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// DecodeConfig decodes YAML into c, over the values c already holds. Unknown
// keys are an error.
func DecodeConfig(data []byte, c *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(c)
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	msgs := []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	if te := new(yaml.TypeError); errors.As(err, &te) {
		msgs = te.Errors
	}
	for i, m := range msgs {
		msgs[i] = unknownField.ReplaceAllString(m, `unknown key "$1"`)
	}
	return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.Join(msgs, "; "))
}

// unknownField matches yaml.v3's message for a key the target struct lacks.
var unknownField = regexp.MustCompile(`field (\S+) not found in type \S+`)
