// Command keyline runs the Keyline MQTT broker.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/keyline-mq/keyline/broker"
)

// version, commit and buildDate are set by dist/release.sh with
// -ldflags "-X main.version=... -X main.commit=... -X main.buildDate=...".
// A plain `go build` leaves them empty; versionLine then falls back to what
// the Go toolchain recorded (module version, VCS revision and time).
var version, commit, buildDate string

// defaultGCPercent is the GC target keyline runs with unless GOGC is set. A
// broker's garbage is per message; measured back to back (loadgen fanout, 100
// subscribers; slowsub, 10 subscribers with one stalled), GOGC 100/200/400
// cost 3.0/2.6/2.3 us of CPU per delivery and peaked at 50/66/96 MiB RSS.
// 200 takes most of the CPU gain for a third more memory.
const defaultGCPercent = 200

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a mistake in the command line itself (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "groups" || args[0] == "dlq" || args[0] == "bridges") {
		return runCLI(args, stdout, stderr)
	}
	if len(args) > 0 {
		switch args[0] {
		case "check":
			return runCheck(args[1:], stdout, stderr)
		case "backup":
			return runBackup(args[1:], stdout, stderr)
		case "restore":
			return runRestore(args[1:], stdout, stderr)
		case "passwd":
			return runPasswd(args[1:], os.Stdin, stdout, stderr)
		}
	}
	cfg, action, err := parseArgs(args)
	if err != nil {
		if errors.As(err, new(usageError)) || errors.Is(err, broker.ErrInvalidConfig) {
			fmt.Fprintf(stderr, "keyline: %v (see keyline --help)\n", err)
			return 2
		}
		fmt.Fprintf(stderr, "keyline: %v\n", err)
		return 1
	}
	switch action {
	case actionHelp:
		printUsage(stdout)
		return 0
	case actionVersion:
		fmt.Fprintln(stdout, versionLine())
		return 0
	}

	logger, err := broker.NewLogger(stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintf(stderr, "keyline: %v\n", err)
		return 2
	}
	b, err := broker.New(cfg, logger)
	if err != nil {
		fmt.Fprintf(stderr, "keyline: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// SIGHUP (and POST /api/v1/reload) re-read the config file and the
	// command line; a reload that fails is logged and changes nothing.
	b.SetReloadSource(func() (broker.Config, error) {
		cfg, _, err := parseArgs(args)
		return cfg, err
	})
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-hup:
				_, _ = b.Reload() // logged by Reload
			case <-ctx.Done():
				return
			}
		}
	}()
	if err := b.Run(ctx); err != nil {
		fmt.Fprintf(stderr, "keyline: %v\n", err)
		return 1
	}
	return 0
}

type action int

const (
	actionRun action = iota
	actionHelp
	actionVersion
)

// flagGroup is one section of `keyline --help`.
type flagGroup struct {
	title string
	fs    *pflag.FlagSet
}

// bindFlags registers every flag on groups bound to cfg, with cfg's current
// values as the defaults, so parsing only overwrites flags given explicitly.
func bindFlags(cfg *broker.Config, configPath *string, help, showVersion *bool) []flagGroup {
	g := func(title string) flagGroup {
		return flagGroup{title, pflag.NewFlagSet(title, pflag.ContinueOnError)}
	}
	listen, store, mqttLimits, fanout, logs, keyshared, general := g("Listeners"), g("Storage"), g("MQTT limits"), g("Fan-out (every connection's outbound queue)"), g("Logs"), g("Key-Shared groups ($share/<group>/<filter>)"), g("General")
	cluster := g("Cluster (NATS JetStream; off without --nats)")

	f := listen.fs
	f.StringVar(&cfg.TCP, "tcp", cfg.TCP, "MQTT over TCP address (empty disables)")
	f.StringVar(&cfg.WS, "ws", cfg.WS, "MQTT over WebSocket address, e.g. :8080 (empty disables)")
	f.StringVar(&cfg.TLS, "tls", cfg.TLS, "MQTT over TLS address, e.g. :8883 (needs --tls-cert and --tls-key)")
	f.StringVar(&cfg.WSS, "wss", cfg.WSS, "MQTT over WebSocket over TLS address, e.g. :8443 (needs --tls-cert and --tls-key; the client certificate options apply)")
	f.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "PEM certificate (chain) file for --tls and --wss (reloaded on SIGHUP)")
	f.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "PEM private key file for --tls and --wss (reloaded on SIGHUP)")
	f.StringVar(&cfg.TLSClientCA, "tls-client-ca", cfg.TLSClientCA, "PEM bundle of the CAs that sign client certificates (reloaded on SIGHUP)")
	f.Var(&cfg.TLSClientAuth, "tls-client-auth", "client certificates on --tls and --wss: none, request (verified when sent) or require")
	f.Var(&cfg.TLSIdentity, "tls-identity", "what of a verified client certificate becomes the MQTT user name, with no password: cn, san-dns, san-uri or none")
	f.StringVar(&cfg.TLSCRL, "tls-crl", cfg.TLSCRL, "PEM certificate revocation lists, signed by a CA of --tls-client-ca (reloaded on SIGHUP)")
	f.StringVar(&cfg.JWTKey, "jwt-key", cfg.JWTKey, "PEM public keys (RSA, EC P-256) or JWKS file: a password that is a JWT (RS256/ES256) signed by one, unexpired, connects as its sub/username claim, until its exp (reloaded on SIGHUP)")
	f.StringVar(&cfg.JWTACLClaim, "jwt-acl-claim", cfg.JWTACLClaim, "claim of a JWT holding its own ACL, {filter: access 0-3}, tried before the config's rules (empty: none)")
	f.DurationVar(&cfg.ReloadWatch, "reload-watch", cfg.ReloadWatch, "poll the config file, password file, TLS files and JWT keys this often and reload when one changed (0: only on SIGHUP)")
	f.StringVar(&cfg.PasswordFile, "password-file", cfg.PasswordFile, "users and password hashes, one user:hash a line (keyline passwd or mosquitto_passwd write it; reloaded on SIGHUP)")
	f.StringVar(&cfg.HTTP, "http", cfg.HTTP, "HTTP address for /metrics, /healthz, /readyz and the admin API (empty disables)")
	f.StringVar(&cfg.HTTPToken, "http-token", cfg.HTTPToken, "bearer token the admin API (/api/v1) requires (empty: none; also $KEYLINE_HTTP_TOKEN or the config file, which keep it off the command line)")
	f.StringSliceVar(&cfg.HTTPAllowedHosts, "http-allowed-hosts", cfg.HTTPAllowedHosts, "host names the HTTP listener answers to, besides IP addresses and localhost (DNS rebinding protection)")
	f.DurationVar(&cfg.HTTPReadTimeout, "http-read-timeout", cfg.HTTPReadTimeout, "longest an HTTP client may take to send a request, body included")
	f.IntVar(&cfg.HTTPMaxConns, "http-max-conns", cfg.HTTPMaxConns, "HTTP connections served at once; at the cap the oldest without a request in progress is closed, and only when all are busy does a new one wait")
	f.StringVar(&cfg.HTTPTopicUser, "http-topic-user", cfg.HTTPTopicUser, "auth ledger user whose read ACL the console's topic stream applies (with a ledger and no --http-token the stream is off without it)")
	f.IntVar(&cfg.HTTPMaxConnsPerAddress, "http-max-conns-per-address", cfg.HTTPMaxConnsPerAddress, "HTTP connections of one client address (0: no bound beyond --http-max-conns)")
	f.BoolVar(&cfg.Pprof, "pprof", cfg.Pprof, "serve Go's profiler under /debug/pprof/ on --http (behind the token when one is set)")
	f.StringSliceVar(&cfg.WSAllowedOrigins, "ws-allowed-origins", cfg.WSAllowedOrigins, "browser origins a WebSocket connection may come from, besides the listener's own host (* for any)")
	f.Var(&cfg.SessionOwnership, "session-ownership", "with auth, a CONNECT using another user's client id is refused, or gets a fresh session: refuse or fresh")

	f = store.fs
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory holding the data file (keyline.db) and the group log (segments/)")
	f.BoolVar(&cfg.Fsync, "fsync", cfg.Fsync, "fsync every commit; --fsync=false survives a process crash but not a power loss")
	f.Var(&cfg.SegmentSize, "segment-size", "size of each file of the group message log under data-dir/segments (64KiB to 1GiB)")
	f.DurationVar(&cfg.CommitInterval, "commit-interval", cfg.CommitInterval, "longest a QoS 1/2 publish to a Key-Shared group waits for others to share its commit (write + fdatasync); commits go early once they hold what their publishers have in flight, and at once while publishes come more than half a commit's time apart (0: no waiting)")
	f.IntVar(&cfg.CommitMinAppends, "commit-min-appends", cfg.CommitMinAppends, "fewest publishes a commit waits for, within commit-interval (above 1: fewer fdatasyncs at low rates, up to commit-interval of latency each)")

	f = mqttLimits.fs
	f.Uint32Var(&cfg.MaxPacketSize, "max-packet-size", cfg.MaxPacketSize, "largest MQTT packet accepted, in bytes (0: no limit)")
	f.Int64Var(&cfg.MaxClients, "max-clients", cfg.MaxClients, "most clients connected at once; past it CONNACK 0x89 (3.1.1: 0x03) (0: no limit; the default is the open-files limit minus 512)")
	f.Uint16Var(&cfg.MaxInflight, "max-inflight", cfg.MaxInflight, "QoS 1/2 messages held per session, queued or unacknowledged")
	f.Var(&cfg.MaxSessionQueueBytes, "max-session-queue-bytes", "bytes of QoS 1/2 messages held per session, queued or unacknowledged (0: no limit)")
	f.Var(&cfg.SpillAfter, "spill-after", "bytes of QoS 1/2 messages a session keeps in memory; the frames of those it holds beyond wait in data-dir/spill until its client reads them (0: all in memory)")
	f.Var(&cfg.MaxQueuedBytes, "max-queued-bytes", "bytes of QoS 1/2 messages held for all sessions together (0: no limit)")
	f.Float64Var(&cfg.RateLimits.ConnectRatePerListener, "connect-rate-per-listener", cfg.RateLimits.ConnectRatePerListener, "CONNECTs per second each listener accepts; more get 0x9F (3.1.1: 0x03) (0: no limit)")
	f.Float64Var(&cfg.RateLimits.ConnectRatePerAddress, "connect-rate-per-address", cfg.RateLimits.ConnectRatePerAddress, "CONNECTs per second from one source address; more get 0x9F (3.1.1: 0x03) (0: no limit)")
	f.Float64Var(&cfg.RateLimits.ClientMessagesRate, "client-messages-rate", cfg.RateLimits.ClientMessagesRate, "PUBLISH messages per second one connection may send; past it the broker stops reading it for a moment (0: no limit)")
	f.Var(&cfg.RateLimits.ClientBytesRate, "client-bytes-rate", "PUBLISH bytes (topic and payload) per second one connection may send, e.g. 1MiB; past it the broker stops reading it for a moment (0: no limit)")
	f.Uint16Var(&cfg.ReceiveMaximum, "receive-maximum", cfg.ReceiveMaximum, "QoS 1/2 publishes a client may have unacknowledged towards the broker")
	f.DurationVar(&cfg.MaxSessionExpiry, "max-session-expiry", cfg.MaxSessionExpiry, "how long a disconnected persistent session is kept at most; MQTT 3.1.1 sessions are kept this long (0: no cap, 3.1.1 sessions never expire)")
	f.DurationVar(&cfg.MaxMessageExpiry, "max-message-expiry", cfg.MaxMessageExpiry, "drop retained and queued messages older than this (0: keep)")
	f.StringVar(&cfg.ServerReference, "server-reference", cfg.ServerReference, "on shutdown, tell MQTT 5 clients to use this server instead (DISCONNECT 0x9C with this Server Reference; empty: 0x8B)")
	f.IntVar(&cfg.MaxSubscriptionsPerClient, "max-subscriptions-per-client", cfg.MaxSubscriptionsPerClient, "most subscriptions one client may hold; past it SUBACK 0x97 (0: no limit)")
	f.Int64Var(&cfg.MaxSubscriptions, "max-subscriptions", cfg.MaxSubscriptions, "most subscriptions all clients may hold together; past it SUBACK 0x97 (0: no limit)")
	f.Var(&cfg.MaxClientID, "max-client-id", "longest client id accepted, in bytes (23 to 16KiB); longer: CONNACK 0x85, 3.1.1: 0x02")
	f.IntVar(&cfg.MaxTopicLevels, "max-topic-levels", cfg.MaxTopicLevels, "most levels of a topic or filter a client sends; deeper: SUBACK 0x8F, PUBACK 0x90, 3.1.1 disconnect, QoS 0 dropped (0: no limit)")
	f.Uint16Var(&cfg.TopicAliasMaximum, "topic-alias-maximum", cfg.TopicAliasMaximum, "inbound topic aliases an MQTT 5 connection may set (its CONNACK says so); past it DISCONNECT 0x94 (0: none)")
	f.Var(&cfg.TopicAliasBytes, "topic-alias-bytes", "bytes of topics one connection's topic aliases may hold, each way; inbound past it DISCONNECT 0x97, outbound topics go without an alias (0: no limit)")
	f.DurationVar(&cfg.MaxKeepAlive, "max-keep-alive", cfg.MaxKeepAlive, "longest keep alive an MQTT 5 client may use; one asking for more or none is told this one (Server Keep Alive; 0: their own)")

	f = fanout.fs
	f.Var(&cfg.SlowPolicy, "slow-policy", "what happens to QoS 0 messages a slow client has no room for: drop-oldest, drop-newest, disconnect, or conflate (keep the newest per topic)")
	f.Var(&cfg.ConnQueueSoft, "conn-queue-soft", "outbound queue size a client may exceed for --conn-queue-grace (e.g. 512KiB)")
	f.Var(&cfg.ConnQueueHard, "conn-queue-hard", "outbound queue size never exceeded; acks and QoS 1/2 messages past it disconnect the client")
	f.DurationVar(&cfg.ConnQueueGrace, "conn-queue-grace", cfg.ConnQueueGrace, "how long a queue may stay above --conn-queue-soft")

	f = logs.fs
	f.Var(&cfg.LogLevel, "log-level", broker.LogLevels.String())
	f.Var(&cfg.LogFormat, "log-format", broker.LogFormats.String())

	f = keyshared.fs
	f.StringVar(&cfg.KeyProperty, "key-property", cfg.KeyProperty, "MQTT 5 user property holding a message's routing key (else the topic)")
	f.Var(&cfg.MaxKeySize, "max-key-size", "longest routing key accepted; longer: MQTT 5 PUBACK 0x99, 3.1.1 disconnect, QoS 0 dropped (0: no limit)")
	f.IntVar(&cfg.MaxGroups, "max-groups", cfg.MaxGroups, "most groups; a SUBSCRIBE that would create one more gets 0x97 (0: no limit)")
	f.IntVar(&cfg.MaxGroupsPerClient, "max-groups-per-client", cfg.MaxGroupsPerClient, "most groups one client may be a member of; past it SUBACK 0x97 (0: no limit)")
	f.IntVar(&cfg.MaxGroupsPerUser, "max-groups-per-user", cfg.MaxGroupsPerUser, "most groups the clients of one user (with auth; else of one address) may have created; past it SUBACK 0x97 (0: no limit)")
	f.DurationVar(&cfg.AckTimeout, "ack-timeout", cfg.AckTimeout, "time a member has to acknowledge a message before it is retried")
	f.IntVar(&cfg.MaxDeliveries, "max-deliveries", cfg.MaxDeliveries, "failed deliveries (nacks, timeouts, lost members) before the poison policy applies")
	f.Var(&cfg.PoisonPolicy, "poison-policy", "for a message past --max-deliveries: dead-letter, drop or block (only its key stops)")
	f.DurationSliceVar(&cfg.RetryBackoff, "retry-backoff", cfg.RetryBackoff, "delay before a retry, doubling per attempt: base[,max]")
	f.IntVar(&cfg.MemberMaxInflight, "member-max-inflight", cfg.MemberMaxInflight, "messages in flight per member (lowered to its Receive Maximum)")
	f.IntVar(&cfg.Window, "window", cfg.Window, "messages in flight plus blocked per group; when full the group stops reading its log")
	f.Var(&cfg.WindowBytes, "window-bytes", "bytes of messages in flight plus blocked per group; when reached the group stops reading its log")
	f.Uint64Var(&cfg.BacklogMaxMessages, "backlog-max-messages", cfg.BacklogMaxMessages, "unresolved messages a group keeps, with or without members (0: no limit)")
	f.Var(&cfg.BacklogMaxBytes, "backlog-max-bytes", "unresolved bytes a group keeps, with or without members (0: no limit)")
	f.Var(&cfg.BacklogPolicy, "backlog-policy", "at a backlog limit: reject (MQTT 5 PUBACK 0x97) or drop-oldest")
	f.DurationVar(&cfg.GroupBacklogTTL, "group-backlog-ttl", cfg.GroupBacklogTTL, "delete a group after this long without members when it holds messages (not dead letters), with them (0: never)")
	f.DurationVar(&cfg.GroupIdleTTL, "group-idle-ttl", cfg.GroupIdleTTL, "delete a group after this long without members, backlog and dead letters (0: never); one holding messages: --group-backlog-ttl")

	f, c := cluster.fs, &cfg.Cluster // every field of broker.ClusterConfig, under its YAML key
	f.StringSliceVar(&c.NATS, "nats", c.NATS, "NATS server URLs (URL[,URL...]); turns cluster mode on: sessions and retained messages live in JetStream")
	f.StringVar(&c.NodeID, "node-id", c.NodeID, "this node's id, unique in the cluster (default the host name)")
	f.IntVar(&c.NATSReplicas, "nats-replicas", c.NATSReplicas, "JetStream replicas of keyline's streams and bucket (capped by the NATS cluster's size)")
	f.StringVar(&c.NATSCreds, "nats-creds", c.NATSCreds, "NATS credentials file (JWT and nkey seed)")
	f.StringVar(&c.NATSTLSCert, "nats-tls-cert", c.NATSTLSCert, "PEM client certificate for NATS (with --nats-tls-key)")
	f.StringVar(&c.NATSTLSKey, "nats-tls-key", c.NATSTLSKey, "PEM private key of --nats-tls-cert")
	f.StringVar(&c.NATSTLSCA, "nats-tls-ca", c.NATSTLSCA, "PEM CA bundle that signs the NATS servers' certificates")
	f.DurationVar(&c.QueueMaxAge, "nats-queue-max-age", c.QueueMaxAge, "QoS 1/2 messages are kept for offline sessions at most this long")
	f.Var(&c.QueueMaxBytes, "nats-queue-max-bytes", "and at most this many bytes, cluster-wide (e.g. 1GiB)")
	f.DurationVar(&c.StartTimeout, "nats-start-timeout", c.StartTimeout, "how long startup waits for NATS")

	f = general.fs
	f.Var(&broker.BridgeFlags{Dst: &cfg.Bridges}, "bridge", `a bridge to another MQTT broker as key=value fields with the config file's keys, e.g. 'name=cloud address=central:1883 topic="sensors/# out 1"' (repeatable; replaces the file's bridges; see README "Bridges")`)
	f.StringVar(configPath, "config", *configPath, "YAML config file; every flag is also a key there, and flags win")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "bound on a graceful shutdown after SIGINT/SIGTERM")
	f.BoolVarP(help, "help", "h", false, "show this help")
	f.BoolVar(showVersion, "version", false, "print the version")

	return []flagGroup{listen, store, mqttLimits, fanout, logs, keyshared, cluster, general}
}

func newFlagSet(cfg *broker.Config, configPath *string, help, showVersion *bool) *pflag.FlagSet {
	fs := pflag.NewFlagSet("keyline", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed once, by run
	for _, g := range bindFlags(cfg, configPath, help, showVersion) {
		fs.AddFlagSet(g.fs)
	}
	return fs
}

// parseArgs turns the command line (and the config file it names) into a
// Config: defaults, then the file, then the flags given explicitly.
func parseArgs(args []string) (broker.Config, action, error) {
	var configPath string
	var help, showVersion bool
	probe := broker.DefaultConfig()
	fs := newFlagSet(&probe, &configPath, &help, &showVersion)
	if err := fs.Parse(args); err != nil {
		return probe, actionRun, usageError{err}
	}
	if fs.NArg() > 0 {
		return probe, actionRun, usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	switch {
	case help:
		return probe, actionHelp, nil
	case showVersion:
		return probe, actionVersion, nil
	}
	if configPath == "" {
		return probe, actionRun, finishConfig(&probe)
	}

	cfg := broker.DefaultConfig()
	if err := broker.LoadConfigFile(configPath, &cfg); err != nil {
		return cfg, actionRun, err
	}
	fs = newFlagSet(&cfg, &configPath, &help, &showVersion)
	if err := fs.Parse(args); err != nil {
		return cfg, actionRun, usageError{err}
	}
	cfg.ConfigFile = configPath
	return cfg, actionRun, finishConfig(&cfg)
}

// finishConfig takes the admin token from $KEYLINE_HTTP_TOKEN when neither a
// flag nor the file gave one (so it need not sit on the command line, where
// every local user can read it), then validates.
func finishConfig(cfg *broker.Config) error {
	if cfg.HTTPToken == "" {
		cfg.HTTPToken = os.Getenv("KEYLINE_HTTP_TOKEN")
	}
	return cfg.Validate()
}

func printUsage(w io.Writer) {
	var configPath string
	var help, showVersion bool
	cfg := broker.DefaultConfig()
	fmt.Fprint(w, `keyline: an MQTT 3.1.1 and 5 broker with Key-Shared subscriptions.

Usage:
  keyline [flags]
  keyline groups [list | show GROUP | delete GROUP] [--server URL] [--token T] [--json]
  keyline dlq list|replay|purge GROUP [--id N | --all] [--after N --limit N] [--server URL] [--token T] [--json]
  keyline bridges [list | show NAME] [--server URL] [--token T] [--json]
      (admin subcommands: they call a running broker's admin API; see keyline groups --help)
  keyline check [--data-dir DIR] [--json]
      (offline check of a stopped broker's data dir; exit code 1 names the damage it found)
  keyline passwd [-c | -D] [--hash argon2id|bcrypt] FILE USER
      (writes USER's password hash into a password file, as mosquitto_passwd does)

`)
	for _, g := range bindFlags(&cfg, &configPath, &help, &showVersion) {
		fmt.Fprintf(w, "%s:\n%s\n", g.title, g.fs.FlagUsages())
	}
	fmt.Fprint(w, `Auth users and ACL rules live in the config file only (mochi's ledger format, under "auth:");
SIGHUP or POST /api/v1/reload re-reads them with the password file and the certificates.
See README.md for the config file reference.
`)
}
