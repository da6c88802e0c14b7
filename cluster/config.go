package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Config is what a node needs to join a cluster.
type Config struct {
	URLs     []string // NATS servers; more than one lets the client fail over
	NodeID   string   // unique per Keyline node; names its consumer and ownership subject
	Replicas int      // JetStream replicas of streams and buckets; lowered to what the NATS cluster can hold

	Creds   string // NATS credentials file (JWT + nkey seed), optional
	TLSCert string // client certificate for NATS (with TLSKey), optional
	TLSKey  string
	TLSCA   string // CA bundle that signs the NATS servers' certificates, optional

	// QueueMaxAge and QueueMaxBytes bound the stream of QoS 1/2 messages:
	// a persistent session offline for longer than QueueMaxAge (or behind by
	// more than QueueMaxBytes of cluster traffic) loses its oldest queued
	// messages.
	QueueMaxAge   time.Duration
	QueueMaxBytes int64

	// RequestTimeout bounds one JetStream call; publishes and record writes
	// are retried until PublishTimeout.
	RequestTimeout time.Duration
	PublishTimeout time.Duration

	Logger *slog.Logger
}

// Defaults for the zero fields of Config.
const (
	DefaultReplicas       = 3
	DefaultQueueMaxAge    = 24 * time.Hour
	DefaultQueueMaxBytes  = 1 << 30
	DefaultRequestTimeout = 2 * time.Second
	DefaultPublishTimeout = 15 * time.Second // covers a JetStream leader election (5-8 s measured)
)

// ErrConfig wraps configuration errors.
var ErrConfig = errors.New("cluster: invalid configuration")

func (c *Config) withDefaults() Config {
	out := *c
	if out.Replicas == 0 {
		out.Replicas = DefaultReplicas
	}
	if out.QueueMaxAge == 0 {
		out.QueueMaxAge = DefaultQueueMaxAge
	}
	if out.QueueMaxBytes == 0 {
		out.QueueMaxBytes = DefaultQueueMaxBytes
	}
	if out.RequestTimeout == 0 {
		out.RequestTimeout = DefaultRequestTimeout
	}
	if out.PublishTimeout == 0 {
		out.PublishTimeout = DefaultPublishTimeout
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

// Validate reports the first problem with c.
func (c *Config) Validate() error {
	switch {
	case len(c.URLs) == 0:
		return fmt.Errorf("%w: no NATS URL", ErrConfig)
	case c.NodeID == "":
		return fmt.Errorf("%w: node id is empty", ErrConfig)
	case len(c.NodeID) > 128 || strings.ContainsAny(c.NodeID, " \t\r\n"):
		return fmt.Errorf("%w: node id %q must be at most 128 bytes without whitespace", ErrConfig, c.NodeID)
	case c.Replicas < 0 || c.Replicas > 5:
		return fmt.Errorf("%w: replicas must be between 1 and 5", ErrConfig)
	case (c.TLSCert == "") != (c.TLSKey == ""):
		return fmt.Errorf("%w: a NATS TLS client certificate needs both cert and key", ErrConfig)
	case c.QueueMaxAge < 0 || c.QueueMaxBytes < 0:
		return fmt.Errorf("%w: queue limits must not be negative", ErrConfig)
	}
	for _, u := range c.URLs {
		if strings.TrimSpace(u) == "" {
			return fmt.Errorf("%w: empty NATS URL", ErrConfig)
		}
	}
	return nil
}

// hashToken is a subject- and key-safe digest of s: node ids and client ids
// never appear raw in a subject or key.
func hashToken(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:12])
}
