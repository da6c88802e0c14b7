package broker

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/keyline-mq/keyline/bridge"
	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/persistence"
)

// BridgeConfig is one bridge as the config file (under "bridges:") and the
// --bridge flag write it; its keys follow mosquitto's bridge settings (see
// README "Bridges" for the line-by-line mapping). Zero fields take the
// defaults of bridge.DefaultConfig.
type BridgeConfig struct {
	Name      string   `yaml:"name"`
	Addresses []string `yaml:"addresses"`
	ClientID  string   `yaml:"client-id"` // default: <host name>.<name>, as mosquitto's
	Username  string   `yaml:"username"`
	Password  string   `yaml:"password"`
	// Protocol is "3.1.1" (default) or "5".
	Protocol   string         `yaml:"protocol"`
	TryPrivate *bool          `yaml:"try-private"` // default true
	CleanStart bool           `yaml:"clean-start"`
	TLS        *BridgeTLS     `yaml:"tls"`
	Topics     []BridgeTopic  `yaml:"topics"`
	Session    time.Duration  `yaml:"session-expiry"`
	KeepAlive  *time.Duration `yaml:"keep-alive"`
	// ReconnectBackoff is min[,max] between reconnection attempts.
	ReconnectBackoff   []time.Duration           `yaml:"reconnect-backoff"`
	ConnectTimeout     time.Duration             `yaml:"connect-timeout"`
	AckTimeout         time.Duration             `yaml:"ack-timeout"`
	MaxInflight        int                       `yaml:"max-inflight"`
	InboundMax         int                       `yaml:"inbound-max"`
	MaxDeliveries      int                       `yaml:"max-deliveries"`
	BacklogMaxMessages uint64                    `yaml:"backlog-max-messages"`
	BacklogMaxBytes    ByteSize                  `yaml:"backlog-max-bytes"`
	BacklogPolicy      persistence.BacklogPolicy `yaml:"backlog-policy"` // drop-oldest (default) or reject
}

// BridgeTLS turns TLS on for a bridge's connection.
type BridgeTLS struct {
	CAFile             string `yaml:"ca-file"`   // PEM CAs the remote's certificate must chain to (default: the system's)
	CertFile           string `yaml:"cert-file"` // client certificate (with key-file)
	KeyFile            string `yaml:"key-file"`
	ServerName         string `yaml:"server-name"` // default: the address's host
	InsecureSkipVerify bool   `yaml:"insecure-skip-verify"`
}

// BridgeTopic is one topic rule: a mosquitto topic line in a string
// ("sensors/# out 1 site/ central/site-7/"), or the same as a mapping.
type BridgeTopic struct{ bridge.Rule }

// UnmarshalYAML reads a topic line or a mapping.
func (t *BridgeTopic) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		r, err := bridge.ParseRule(n.Value)
		if err != nil {
			return err
		}
		t.Rule = r
		return nil
	}
	var m struct {
		Pattern      string `yaml:"pattern"`
		Direction    string `yaml:"direction"`
		QoS          byte   `yaml:"qos"`
		LocalPrefix  string `yaml:"local-prefix"`
		RemotePrefix string `yaml:"remote-prefix"`
		Ordered      bool   `yaml:"ordered"`
	}
	dec := *n
	if err := dec.Decode(&m); err != nil {
		return err
	}
	r := bridge.Rule{Pattern: m.Pattern, Direction: bridge.Out, QoS: m.QoS, LocalPrefix: m.LocalPrefix, RemotePrefix: m.RemotePrefix, Ordered: m.Ordered}
	if m.Direction != "" {
		d, err := bridge.ParseDirection(m.Direction)
		if err != nil {
			return err
		}
		r.Direction = d
	}
	t.Rule = r
	return r.Validate()
}

// MarshalYAML writes the topic line.
func (t BridgeTopic) MarshalYAML() (any, error) { return t.Rule.String(), nil }

// bridgeConfig resolves c into what package bridge runs (TLS files read).
func (c *BridgeConfig) bridgeConfig() (bridge.Config, error) {
	out := bridge.DefaultConfig()
	out.Name, out.Addresses, out.ClientID = c.Name, c.Addresses, c.ClientID
	if out.ClientID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "keyline"
		}
		out.ClientID = host + "." + c.Name
	}
	out.Username, out.Password, out.CleanStart, out.SessionExpiry = c.Username, c.Password, c.CleanStart, c.Session
	switch c.Protocol {
	case "", "3.1.1", "mqttv311", "4":
		out.Protocol = bridge.MQTT311
	case "5", "5.0", "mqttv50":
		out.Protocol = bridge.MQTT5
	default:
		return out, fmt.Errorf("%w: bridge %q: protocol %q: want 3.1.1 or 5", ErrInvalidConfig, c.Name, c.Protocol)
	}
	if c.TryPrivate != nil {
		out.TryPrivate = *c.TryPrivate
	}
	if c.KeepAlive != nil {
		out.KeepAlive = *c.KeepAlive
	}
	switch len(c.ReconnectBackoff) {
	case 0:
	case 1:
		out.ReconnectMin = c.ReconnectBackoff[0]
		out.ReconnectMax = max(out.ReconnectMax, out.ReconnectMin)
	case 2:
		out.ReconnectMin, out.ReconnectMax = c.ReconnectBackoff[0], c.ReconnectBackoff[1]
	default:
		return out, fmt.Errorf("%w: bridge %q: reconnect-backoff: want min[,max]", ErrInvalidConfig, c.Name)
	}
	setIf(&out.ConnectTimeout, c.ConnectTimeout)
	setIf(&out.AckTimeout, c.AckTimeout)
	setIf(&out.MaxInflight, c.MaxInflight)
	setIf(&out.InboundMax, c.InboundMax)
	out.MaxDeliveries = c.MaxDeliveries
	out.Backlog.MaxMessages = c.BacklogMaxMessages
	if c.BacklogMaxBytes != 0 {
		out.Backlog.MaxBytes = uint64(c.BacklogMaxBytes)
	}
	if c.BacklogPolicy != 0 {
		out.Backlog.Policy = c.BacklogPolicy
	}
	if c.BacklogMaxBytes < 0 {
		return out, fmt.Errorf("%w: bridge %q: backlog-max-bytes must not be negative", ErrInvalidConfig, c.Name)
	}
	for _, t := range c.Topics {
		out.Rules = append(out.Rules, t.Rule)
	}
	if c.TLS != nil {
		tc, err := c.TLS.config()
		if err != nil {
			return out, fmt.Errorf("%w: bridge %q: tls: %v", ErrInvalidConfig, c.Name, err)
		}
		out.TLS = tc
	}
	if err := out.Validate(); err != nil {
		return out, fmt.Errorf("%w: %s", ErrInvalidConfig, strings.TrimPrefix(err.Error(), bridge.ErrInvalidConfig.Error()+": "))
	}
	return out, nil
}

func setIf[T comparable](dst *T, v T) {
	var zero T
	if v != zero {
		*dst = v
	}
}

func (t *BridgeTLS) config() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify} //nolint:gosec // the operator's choice, named insecure
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca-file %s holds no PEM certificate", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("cert-file and key-file go together")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// validateBridges checks the bridges of c (Validate calls it).
func (c *Config) validateBridges() error {
	cfgs := make([]bridge.Config, 0, len(c.Bridges))
	for i := range c.Bridges {
		bc, err := c.Bridges[i].bridgeConfig()
		if err != nil {
			return err
		}
		cfgs = append(cfgs, bc)
	}
	if err := bridge.ValidateAll(cfgs); err != nil {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, strings.TrimPrefix(err.Error(), bridge.ErrInvalidConfig.Error()+": "))
	}
	return nil
}

// newBridges builds the bridge manager (before the hooks: the Key-Shared
// hook asks it for its groups' settings as it resumes them).
func (b *Broker) newBridges() error {
	cfgs := make([]bridge.Config, 0, len(b.cfg.Bridges))
	for i := range b.cfg.Bridges {
		bc, err := b.cfg.Bridges[i].bridgeConfig()
		if err != nil {
			return err
		}
		cfgs = append(cfgs, bc)
	}
	m, err := bridge.NewManager(cfgs, bridge.Options{
		NodeID: b.cfg.Cluster.nodeIDIfEnabled(), BrokerID: b.brokerID(), MaxPacketSize: b.cfg.MaxPacketSize,
		Logger: b.log,
	})
	if err != nil {
		return err
	}
	b.bridges = m
	return nil
}

// brokerID names this broker in the via mark of bridged messages: the
// node id in a cluster, else the host name and a digest of the data dir
// (two brokers on one host have different data dirs).
func (b *Broker) brokerID() string {
	if id := b.cfg.Cluster.nodeIDIfEnabled(); id != "" {
		return id
	}
	host, _ := os.Hostname()
	dir, err := filepath.Abs(b.cfg.DataDir)
	if err != nil {
		dir = b.cfg.DataDir
	}
	sum := sha256.Sum256([]byte(dir))
	return host + "-" + hex.EncodeToString(sum[:4])
}

func (c ClusterConfig) nodeIDIfEnabled() string {
	if !c.Enabled() {
		return ""
	}
	return c.nodeID()
}

// groupSettingsOf resolves a group's settings: a bridge's own from its
// configuration, any other from the group settings and overrides.
func (b *Broker) groupSettingsOf(name string) (keyshared.Config, persistence.GroupConfig) {
	d, g, _ := b.cfg.groupSettings(name) // validated
	if b.bridges != nil {
		if bd, bg, ok := b.bridges.GroupSettings(name, d); ok {
			d, g = bd, bg
		}
	}
	d.Logger = b.log // the dispatcher adds group=
	return d, g
}

// startBridges starts the bridges once the server serves.
func (b *Broker) startBridges() error {
	if b.bridges == nil || b.bridges.Len() == 0 {
		return nil
	}
	return b.bridges.Start(bridgeLocal{b.keyShared})
}

// bridgeLocal is the Key-Shared hook as package bridge needs it.
type bridgeLocal struct{ ks *hooks.KeyShared }

func (l bridgeLocal) OpenGroup(n share.Name, out keyshared.Deliverer) (bridge.Group, error) {
	return l.ks.OpenInternal(n, out)
}

func (l bridgeLocal) NewInjector(name string, skip func(string) bool) bridge.Injector {
	return bridgeInjector{l.ks.NewInjector(name, skip)}
}

type bridgeInjector struct{ *hooks.Injector }

// Publish marks a refusal no retry can change as such for the bridge.
func (i bridgeInjector) Publish(m *keyshared.Message, retain bool) error {
	err := i.Injector.Publish(m, retain)
	if errors.Is(err, hooks.ErrKeyTooLong) {
		return fmt.Errorf("%w: %v", bridge.ErrRefused, err)
	}
	return err
}

// BridgeFlags is the --bridge flag (pflag.Value): each use adds a bridge
// written as key=value fields with the config file's keys, e.g.
//
//	--bridge 'name=cloud address=central:1883 topic="sensors/# out 1"'
//
// address and topic may repeat (addresses, topics in the file), and a
// section's keys are written with a dot (tls.ca-file=ca.pem). The first use
// replaces the bridges of the config file: flags win.
type BridgeFlags struct {
	Dst *[]BridgeConfig
	set bool
}

// listKeys are the keys whose values add up to a list; singular aliases read better on a command line.
var listKeys = map[string]string{"address": "addresses", "addresses": "addresses", "topic": "topics", "topics": "topics"}

// Set parses one bridge.
func (f *BridgeFlags) Set(s string) error {
	bc, err := ParseBridgeFlag(s)
	if err != nil {
		return err
	}
	if !f.set {
		*f.Dst, f.set = nil, true
	}
	*f.Dst = append(*f.Dst, bc)
	return nil
}

// Type names the flag's value in --help.
func (f *BridgeFlags) Type() string { return "bridge" }

func (f *BridgeFlags) String() string {
	if f.Dst == nil {
		return ""
	}
	names := make([]string, len(*f.Dst))
	for i, b := range *f.Dst {
		names[i] = b.Name
	}
	return strings.Join(names, ",")
}

// ParseBridgeFlag reads a bridge written as key=value fields.
func ParseBridgeFlag(s string) (BridgeConfig, error) {
	var bc BridgeConfig
	fields, err := bridge.SplitFields(s)
	if err != nil {
		return bc, fmt.Errorf("%w: --bridge: %v", ErrInvalidConfig, err)
	}
	root := &yaml.Node{Kind: yaml.MappingNode}
	lists := map[string]*yaml.Node{}
	sections := map[string]*yaml.Node{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return bc, fmt.Errorf("%w: --bridge: %q is not key=value", ErrInvalidConfig, f)
		}
		m := root
		if sec, sub, dotted := strings.Cut(k, "."); dotted {
			if sections[sec] == nil {
				sections[sec] = &yaml.Node{Kind: yaml.MappingNode}
				root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: sec}, sections[sec])
			}
			m, k = sections[sec], sub
		}
		val := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v}
		if k == "reconnect-backoff" {
			val = &yaml.Node{Kind: yaml.SequenceNode}
			for _, d := range strings.Split(v, ",") {
				val.Content = append(val.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: d})
			}
		}
		if lk, ok := listKeys[k]; ok {
			seq := lists[lk]
			if seq == nil {
				seq = &yaml.Node{Kind: yaml.SequenceNode}
				lists[lk] = seq
				m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: lk}, seq)
			}
			seq.Content = append(seq.Content, val)
			continue
		}
		if val.Kind == yaml.ScalarNode && v != "" && !strings.ContainsAny(v, " \"") {
			val.Tag = "" // let YAML read numbers, booleans and durations
		}
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, val)
	}
	data, err := yaml.Marshal(root)
	if err != nil {
		return bc, fmt.Errorf("%w: --bridge: %v", ErrInvalidConfig, err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&bc); err != nil {
		msg := unknownField.ReplaceAllString(strings.TrimPrefix(err.Error(), "yaml: "), `unknown key "$1"`)
		return bc, fmt.Errorf("%w: --bridge: %s", ErrInvalidConfig, msg)
	}
	return bc, nil
}

// stopBridges disconnects the bridges, within the shutdown timeout.
func (b *Broker) stopBridges() {
	if b.bridges == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.ShutdownTimeout)
	defer cancel()
	if err := b.bridges.Stop(ctx); err != nil {
		b.log.Warn("bridges did not stop in time", "error", err)
	}
}
