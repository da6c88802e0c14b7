package bridge

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/persistence"
)

// ErrInvalidConfig wraps every configuration error; the wrapping error names
// the bridge and the setting.
var ErrInvalidConfig = errors.New("bridge: invalid configuration")

// Protocol versions a bridge speaks to its remote.
const (
	MQTT311 byte = 4
	MQTT5   byte = 5
)

// Config is one bridge: a connection to a remote broker and the topic rules
// that say what crosses it. Start from DefaultConfig.
type Config struct {
	// Name names the bridge in logs, figures and its groups: letters,
	// digits, '-' and '_', at most 64 bytes.
	Name string
	// Addresses are the remote's host:port addresses, tried in order on
	// every (re)connection.
	Addresses []string
	// ClientID is the client id on the remote.
	ClientID string
	// Username and Password, when set, go in the CONNECT.
	Username, Password string
	// TLS, when set, wraps the connection (a client certificate goes in
	// its Certificates).
	TLS *tls.Config
	// Protocol is MQTT311 or MQTT5.
	Protocol byte
	// TryPrivate marks an MQTT 3.1.1 CONNECT as a bridge's (protocol level
	// 0x84, as mosquitto's try_private does), so that a remote that knows
	// the mark does not send the bridge's own messages back. A remote that
	// refuses it is connected to again without it.
	TryPrivate bool
	// CleanStart starts a new session on the remote at every connection
	// (3.1.1: clean session). Without it the remote keeps the inbound
	// subscriptions and queues for the bridge while it is away.
	CleanStart bool
	// SessionExpiry is how long an MQTT 5 remote keeps the session after a
	// disconnection (without CleanStart); 0: it ends with the connection.
	SessionExpiry time.Duration
	// KeepAlive is the MQTT keep-alive interval; 0 disables it.
	KeepAlive time.Duration
	// ConnectTimeout bounds dialling, the TLS handshake and the CONNACK.
	ConnectTimeout time.Duration
	// AckTimeout bounds the wait for the remote's acknowledgement of a
	// publish: past it the connection is considered stuck, closed and made
	// again (MQTT resends only on a new connection).
	AckTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the delay before a reconnection:
	// it doubles from ReconnectMin after every failed attempt, up to
	// ReconnectMax, and a random half to all of it is waited.
	ReconnectMin, ReconnectMax time.Duration
	// MaxInflight caps the outbound publishes awaiting the remote's
	// acknowledgement (the remote's Receive Maximum lowers it).
	MaxInflight int
	// InboundMax is the Receive Maximum the bridge announces to an MQTT 5
	// remote: its publishes awaiting the bridge's acknowledgement.
	InboundMax int
	// Backlog bounds each outbound rule's queue (messages, bytes, policy).
	Backlog persistence.GroupConfig
	// MaxDeliveries is how many failed attempts (the remote refused it with
	// a reason code that may succeed later) a message gets before it is
	// dead-lettered; 0: no limit. Reason codes that cannot succeed later
	// (0x87 not authorized, 0x90 topic name invalid, 0x95 packet too large,
	// 0x99 payload format invalid) dead-letter at once. A lost connection
	// is never an attempt.
	MaxDeliveries int
	// Rules say what crosses the bridge, in mosquitto's `topic` terms.
	Rules []Rule
}

// DefaultConfig returns a bridge's defaults: MQTT 3.1.1 with try_private,
// a persistent session, 60 s keep-alive, reconnection between 1 s and 30 s,
// 1,000 publishes in flight, each outbound rule's queue bounded at 1 GiB
// (drop-oldest).
func DefaultConfig() Config {
	return Config{
		Protocol:       MQTT311,
		TryPrivate:     true,
		KeepAlive:      60 * time.Second,
		ConnectTimeout: 10 * time.Second,
		AckTimeout:     30 * time.Second,
		ReconnectMin:   time.Second,
		ReconnectMax:   30 * time.Second,
		MaxInflight:    1000,
		InboundMax:     100,
		Backlog:        persistence.GroupConfig{MaxBytes: DefaultBacklogBytes, Policy: persistence.PolicyDropOldest},
	}
}

// DefaultBacklogBytes bounds an outbound rule's queue unless configured:
// what a site keeps on disk while its uplink is down.
const DefaultBacklogBytes = 1 << 30

// Direction is which way a rule's messages cross.
type Direction uint8

// Directions, as mosquitto names them.
const (
	Out  Direction = 1 << iota // local to remote
	In                         // remote to local
	Both = Out | In
)

func (d Direction) String() string {
	switch d {
	case Out:
		return "out"
	case In:
		return "in"
	case Both:
		return "both"
	}
	return fmt.Sprintf("direction(%d)", uint8(d))
}

// ParseDirection parses "in", "out" or "both".
func ParseDirection(s string) (Direction, error) {
	switch s {
	case "out":
		return Out, nil
	case "in":
		return In, nil
	case "both":
		return Both, nil
	}
	return 0, fmt.Errorf("direction %q is not one of in, out or both", s)
}

// Rule is one mosquitto `topic` line: messages on Pattern cross in
// Direction at QoS (at most), their topics changed from LocalPrefix+X to
// RemotePrefix+X (out) and back (in). An empty Pattern maps the one topic
// LocalPrefix to RemotePrefix.
type Rule struct {
	Pattern      string
	Direction    Direction
	QoS          byte
	LocalPrefix  string
	RemotePrefix string
	// Ordered keeps at most one message per routing key in flight to the
	// remote (the key user property, else the topic), so a key's order holds
	// across retries and reconnections; otherwise up to the remote's Receive
	// Maximum are in flight, sent in order (which a retry may change).
	Ordered bool
}

// LocalFilter is the filter the rule matches local topics with.
func (r Rule) LocalFilter() string { return r.LocalPrefix + r.Pattern }

// RemoteFilter is the filter the rule subscribes to on the remote.
func (r Rule) RemoteFilter() string { return r.RemotePrefix + r.Pattern }

// ToRemote maps a local topic the rule matched to its remote topic.
func (r Rule) ToRemote(topic string) string {
	return r.RemotePrefix + strings.TrimPrefix(topic, r.LocalPrefix)
}

// ToLocal maps a remote topic to its local topic; false when the topic is
// not under the rule's remote prefix.
func (r Rule) ToLocal(topic string) (string, bool) {
	rest, ok := strings.CutPrefix(topic, r.RemotePrefix)
	if !ok {
		return "", false
	}
	return r.LocalPrefix + rest, true
}

func (r Rule) String() string {
	s := fmt.Sprintf("%s %s %d %s %s", quoteField(r.Pattern), r.Direction, r.QoS, quoteField(r.LocalPrefix), quoteField(r.RemotePrefix))
	if r.Ordered {
		s += " ordered"
	}
	return s
}

func quoteField(s string) string {
	if s == "" || strings.ContainsAny(s, " \t\"") {
		return strconv.Quote(s)
	}
	return s
}

// ParseRule parses a mosquitto topic line (without the word "topic"):
//
//	pattern [[[ out | in | both ] qos-level] local-prefix remote-prefix] [ordered]
//
// Fields are separated by blanks; "" is an empty field (mosquitto writes an
// empty pattern or prefix that way). The defaults are mosquitto's: out, QoS 0,
// no prefixes.
func ParseRule(line string) (Rule, error) {
	fields, err := SplitFields(line)
	if err != nil {
		return Rule{}, err
	}
	r := Rule{Direction: Out}
	if n := len(fields); n > 1 && fields[n-1] == "ordered" {
		fields, r.Ordered = fields[:n-1], true
	}
	switch len(fields) {
	case 1, 2, 3, 5:
	case 0:
		return Rule{}, errors.New("empty topic rule: want pattern [[[out|in|both] qos] local-prefix remote-prefix]")
	default:
		return Rule{}, fmt.Errorf("topic rule %q: %d fields, want pattern [[[out|in|both] qos] local-prefix remote-prefix] [ordered]", line, len(fields))
	}
	r.Pattern = fields[0]
	if len(fields) >= 2 {
		if r.Direction, err = ParseDirection(fields[1]); err != nil {
			return Rule{}, fmt.Errorf("topic rule %q: %w", line, err)
		}
	}
	if len(fields) >= 3 {
		q, err := strconv.Atoi(fields[2])
		if err != nil || q < 0 || q > 2 {
			return Rule{}, fmt.Errorf("topic rule %q: QoS %q is not 0, 1 or 2", line, fields[2])
		}
		r.QoS = byte(q)
	}
	if len(fields) == 5 {
		r.LocalPrefix, r.RemotePrefix = fields[3], fields[4]
	}
	return r, r.Validate()
}

// SplitFields splits s on blanks as a shell does: a "..." part (Go string
// syntax) belongs to the field it stands in, blanks and all, so "" is an
// empty field and a="b c" the field a=b c.
func SplitFields(s string) ([]string, error) {
	var out []string
	for {
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			return out, nil
		}
		var f strings.Builder
		for s != "" && s[0] != ' ' && s[0] != '\t' {
			if s[0] != '"' {
				i := strings.IndexAny(s, " \t\"")
				if i < 0 {
					i = len(s)
				}
				f.WriteString(s[:i])
				s = s[i:]
				continue
			}
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				return nil, fmt.Errorf("unterminated or bad quoted part in %q", s)
			}
			v, _ := strconv.Unquote(q)
			f.WriteString(v)
			s = s[len(q):]
		}
		out = append(out, f.String())
	}
}

// Validate reports what is wrong with the rule.
func (r Rule) Validate() error {
	switch {
	case r.Direction != Out && r.Direction != In && r.Direction != Both:
		return fmt.Errorf("topic rule: direction %v is not in, out or both", r.Direction)
	case r.QoS > 2:
		return fmt.Errorf("topic rule: QoS %d is not 0, 1 or 2", r.QoS)
	case r.Pattern == "" && (r.LocalPrefix == "" || r.RemotePrefix == ""):
		return errors.New(`topic rule: an empty pattern needs both prefixes (it maps the topic local-prefix to remote-prefix)`)
	case strings.ContainsAny(r.LocalPrefix+r.RemotePrefix, "+#"):
		return fmt.Errorf("topic rule: prefixes %q and %q must not hold wildcards", r.LocalPrefix, r.RemotePrefix)
	}
	for _, f := range []struct{ what, filter string }{{"local", r.LocalFilter()}, {"remote", r.RemoteFilter()}} {
		if err := share.ValidFilter(f.filter); err != nil {
			return fmt.Errorf("topic rule %s: %s filter: %v", r, f.what, err)
		}
		if strings.HasPrefix(f.filter, "$") && f.what == "local" {
			return fmt.Errorf("topic rule %s: local filter %q: topics starting with '$' are the broker's own", r, f.filter)
		}
	}
	return nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Validate reports the first problem with c, naming the bridge and the setting.
func (c *Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: bridge %q: "+format, append([]any{ErrInvalidConfig, c.Name}, a...)...)
	}
	switch {
	case !nameRE.MatchString(c.Name):
		return fmt.Errorf("%w: bridge name %q: want 1 to 64 letters, digits, '-' or '_'", ErrInvalidConfig, c.Name)
	case len(c.Addresses) == 0:
		return bad("no addresses (want host:port, tried in order)")
	case c.ClientID == "" || len(c.ClientID) > 65535 || strings.IndexByte(c.ClientID, 0) >= 0:
		return bad("client-id %q: want a non-empty MQTT string", c.ClientID)
	case c.Protocol != MQTT311 && c.Protocol != MQTT5:
		return bad("protocol %d: want 3.1.1 or 5", c.Protocol)
	case c.SessionExpiry < 0 || c.SessionExpiry > math.MaxUint32*time.Second:
		return bad("session-expiry %v: want 0 to 4294967295s", c.SessionExpiry)
	case c.KeepAlive < 0 || c.KeepAlive > 65535*time.Second || (c.KeepAlive > 0 && c.KeepAlive < time.Second):
		return bad("keep-alive %v: want 0 (none) or 1s to 65535s", c.KeepAlive)
	case c.ConnectTimeout <= 0 || c.AckTimeout <= 0:
		return bad("connect-timeout and ack-timeout must be positive")
	case c.ReconnectMin <= 0 || c.ReconnectMax < c.ReconnectMin:
		return bad("reconnect-backoff %v,%v: want a positive minimum and a maximum at least as large", c.ReconnectMin, c.ReconnectMax)
	case c.MaxInflight < 1 || c.MaxInflight > 65535:
		return bad("max-inflight %d: want 1 to 65535", c.MaxInflight)
	case c.InboundMax < 1 || c.InboundMax > 65535:
		return bad("inbound-max %d: want 1 to 65535", c.InboundMax)
	case c.MaxDeliveries < 0:
		return bad("max-deliveries must not be negative")
	case len(c.Rules) == 0:
		return bad("no topic rules")
	}
	if len(c.Username) > 65535 || len(c.Password) > 65535 {
		return bad("username and password must fit an MQTT string")
	}
	for _, a := range c.Addresses {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return bad("address %q is not host:port", a)
		}
	}
	if err := c.Backlog.Validate(); err != nil {
		return bad("%v", err)
	}
	for i, r := range c.Rules {
		if err := r.Validate(); err != nil {
			return bad("topics[%d]: %v", i, err)
		}
	}
	return nil
}

// ValidateAll validates bridges and checks their names are distinct.
func ValidateAll(cs []Config) error {
	seen := map[string]bool{}
	for i := range cs {
		if err := cs[i].Validate(); err != nil {
			return err
		}
		if seen[cs[i].Name] {
			return fmt.Errorf("%w: two bridges are named %q", ErrInvalidConfig, cs[i].Name)
		}
		seen[cs[i].Name] = true
	}
	return nil
}
