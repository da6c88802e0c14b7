package hooks

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
)

// Auth authenticates clients and checks topic access. With a ledger (mochi's
// format: users, auth rules, ACL rules) it is Keyline's auth; without one
// every client may connect and use every topic but the reserved ones.
//
// It differs from mochi's ledger hook where mochi's behaviour would let one
// client reach another's data:
//   - ACL filters are tried in a defined order (acl.go), not Go map order;
//   - a shared subscription $share/<share>/<filter> must be allowed both as
//     that full string (so rules can name share names: who may join which
//     group) and as <filter> (a rule for orders/# governs it too);
//   - $dlq/... is readable only through a filter that names $dlq;
//   - nobody publishes into $dlq/, $share/ or $SYS/ (the broker's own
//     topics): a QoS 1/2 publish gets PUBACK/PUBREC 0x87 (MQTT 5) or a
//     disconnect (3.1.1), a QoS 0 one is dropped and counted;
//   - a client id belongs to the username that holds its session: another
//     user's CONNECT with it is refused (0x87, 3.1.1: 0x05) or, with
//     AuthConfig.FreshSessions, starts a fresh session (the old one is
//     discarded).
type Auth struct {
	mqtt.HookBase
	server *mqtt.Server
	// rules hold the policy in force (who may connect and what they may
	// do); Reload replaces it whole. Its Required never changes.
	rules *ACL
	cfg   AuthConfig
	// clients holds how each connected client authenticated
	// (*mqtt.Client -> *clientAuth), for Reload's re-check (auth_reload.go).
	clients sync.Map
	// ReservedRefused counts publishes into reserved topics, refused.
	ReservedRefused atomic.Uint64
	// Refused counts CONNECTs refused for taking another user's client id.
	Refused atomic.Uint64
	// TokensExpired counts clients disconnected when their JWT expired.
	TokensExpired atomic.Uint64
	// WillsRefused counts CONNECTs refused for a will the client may not
	// publish.
	WillsRefused atomic.Uint64
	// willRefused holds the connections refused for their will until their
	// CONNACK is encoded (*mqtt.Client -> struct{}): it says 0x87 Not
	// authorized rather than mochi's 0x86 Bad user name or password.
	willRefused sync.Map
}

// AuthPolicy is the part of auth a reload replaces.
type AuthPolicy struct {
	// Ledger holds the ACL rules and the users' own ACLs; nil: none.
	Ledger *auth.Ledger
	// Credentials decide user names and passwords; nil: none verify.
	Credentials *Credentials
	// Required: clients must authenticate (a ledger, a password file or
	// certificate identities are configured). Without it every client
	// may connect and use every topic but the reserved ones.
	Required bool
	acl      *acl
}

// NewAuthPolicy compiles a policy.
func NewAuthPolicy(ledger *auth.Ledger, creds *Credentials, required bool) *AuthPolicy {
	return &AuthPolicy{Ledger: ledger, Credentials: creds, Required: required, acl: compileACL(ledger)}
}

// AuthConfig configures an auth hook.
type AuthConfig struct {
	// FreshSessions: a CONNECT with another user's client id discards that
	// session and starts afresh instead of being refused.
	FreshSessions bool
	// OnDiscard (nil: none) is told of a session discarded for
	// FreshSessions (so that stored state goes with it).
	OnDiscard func(cl *mqtt.Client)
	// Identity (nil: none) returns the identity of a client's verified
	// certificate on a listener that uses it as the user name (the broker's
	// --tls-identity); ok is false without one.
	Identity func(cl *mqtt.Client) (name string, ok bool)
	// Admit (nil: none) decides, once a CONNECT has authenticated as user,
	// whether it is within the user's CONNECT rate; when it is not, Admit
	// answers the CONNECT itself (RateLimits.AdmitUser).
	Admit func(cl *mqtt.Client, user string) bool
}

// NewAuth returns an auth hook over rules and the policy they hold
// (NewACL(NewAuthPolicy(nil, nil, false)): allow every client).
func NewAuth(server *mqtt.Server, rules *ACL, cfg AuthConfig) *Auth {
	return &Auth{server: server, rules: rules, cfg: cfg}
}

// Policy returns the policy in force.
func (h *Auth) Policy() *AuthPolicy { return h.rules.policy.Load() }

// ID returns the hook's id.
func (h *Auth) ID() string { return "keyline-auth" }

// Provides reports which hook methods Auth implements.
func (h *Auth) Provides(b byte) bool { return authEvents.has(b) }

var authEvents = eventSet(
	mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnDisconnect, mqtt.OnSessionEstablished, mqtt.OnWill,
)

// OnConnectAuthenticate reports whether the client may connect (by its
// certificate's identity, or its user name and password), and keeps a
// client id to the user whose session it is.
func (h *Auth) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	p := h.Policy()
	if !p.Required {
		return h.willAllowed(cl)
	}
	a, ok := h.authenticate(p, cl, pk)
	if !ok {
		h.Log.Info("client failed authentication", "client", clip(cl.ID), "username", clip(string(pk.Connect.Username)), "remote", cl.Net.Remote)
		return false
	}
	if h.cfg.Admit != nil && !h.cfg.Admit(cl, string(cl.Properties.Username)) {
		return false // answered 0x9F: mochi's CONNACK finds the connection closed
	}
	if !h.ownsClientID(cl) {
		return false
	}
	ca := &clientAuth{authn: a, policy: p}
	if a.kind == authnJWT {
		ca.expiry = time.AfterFunc(time.Until(a.exp), func() { h.tokenExpired(cl) })
	}
	h.clients.Store(cl, ca)
	h.rules.setToken(cl, a.acl)
	if !h.willAllowed(cl) {
		h.OnDisconnect(cl, nil, false) // a refused CONNECT is never attached: mochi calls no OnDisconnect
		return false
	}
	return true
}

// OnWill drops a will the client may no longer publish when its
// connection ends (an ACL reload since its CONNECT took the right away):
// what willAllowed refused at CONNECT is refused when the will goes too.
func (h *Auth) OnWill(cl *mqtt.Client, will mqtt.Will) (mqtt.Will, error) {
	if cl.Net.Inline || h.OnACLCheck(cl, will.TopicName, true) {
		return will, nil
	}
	h.WillsRefused.Add(1)
	h.Log.Info("dropping a will the client may no longer publish", "client", clip(cl.ID), "username", clip(string(cl.Properties.Username)), "will_topic", clip(will.TopicName))
	return will, packets.ErrRejectPacket
}

// willAllowed reports whether cl may publish its will, if it has one, as
// OnACLCheck decides a publish (the ACL, reserved topics): a will is a
// publish made for the client when it goes, and without this check a
// client could write, through its will, to a topic it may not publish to
// (another device's command topic, say). A refused CONNECT gets 0x87 Not
// authorized (MQTT 3.1.1: 0x05).
func (h *Auth) willAllowed(cl *mqtt.Client) bool {
	if cl.Properties.Will.Flag == 0 || h.OnACLCheck(cl, cl.Properties.Will.TopicName, true) {
		return true
	}
	h.WillsRefused.Add(1)
	h.Log.Info("refusing a connection whose will the client may not publish", "client", clip(cl.ID), "username", clip(string(cl.Properties.Username)), "will_topic", clip(cl.Properties.Will.TopicName), "remote", cl.Net.Remote)
	h.willRefused.Store(cl, struct{}{})
	return false
}

// authenticate decides a CONNECT: a verified certificate's identity on a
// listener that takes it becomes the user name (no password is checked, as
// mosquitto's use_identity_as_username); else the user name and password.
func (h *Auth) authenticate(p *AuthPolicy, cl *mqtt.Client, pk packets.Packet) (authn, bool) {
	if h.cfg.Identity != nil {
		if name, ok := h.cfg.Identity(cl); ok {
			if name == "" {
				h.Log.Info("refused a client certificate without the identity the listener takes as user name", "client", clip(cl.ID), "remote", cl.Net.Remote)
				return authn{}, false
			}
			if p.Credentials != nil && p.Credentials.disallowed(name) {
				return authn{}, false
			}
			if string(cl.Properties.Username) != name {
				h.Log.Debug("the certificate's identity is the user name", "client", clip(cl.ID), "identity", clip(name), "username", clip(string(cl.Properties.Username)))
			}
			cl.Properties.Username = []byte(name)
			return authn{kind: authnCert, user: name}, true
		}
	}
	if p.Credentials == nil {
		return authn{}, false
	}
	a, ok := p.Credentials.Authenticate(cl.ID, string(cl.Properties.Username), cl.Net.Remote, pk.Connect.Password)
	if ok && a.kind == authnJWT {
		cl.Properties.Username = []byte(a.user) // the token's user, when the CONNECT named none
	}
	return a, ok
}

// ownsClientID keeps a client id to the user whose session it is: another
// user's CONNECT is refused, or with FreshSessions takes a fresh session.
func (h *Auth) ownsClientID(cl *mqtt.Client) bool {
	existing, ok := h.server.Clients.Get(cl.ID)
	if !ok || bytes.Equal(existing.Properties.Username, cl.Properties.Username) {
		return true
	}
	if h.cfg.FreshSessions {
		h.Log.Info("client id taken by another user: discarding its session", "client", clip(cl.ID),
			"username", clip(string(cl.Properties.Username)), "owner", clip(string(existing.Properties.Username)))
		h.discard(existing)
		return true
	}
	h.Refused.Add(1)
	h.Log.Warn("refused a connection: the client id belongs to another user's session", "client", clip(cl.ID),
		"username", clip(string(cl.Properties.Username)), "owner", clip(string(existing.Properties.Username)), "remote", cl.Net.Remote)
	// Answer "not authorized" ourselves (mochi would say "bad username or
	// password"), then close: mochi's own CONNACK finds the client closed.
	refuseConnect(cl, packets.ErrNotAuthorized, packets.Err3NotAuthorized, errClientIDTaken)
	return false
}

var errClientIDTaken = errors.New("client id belongs to another user")

// discard ends another user's session of the same client id.
func (h *Auth) discard(existing *mqtt.Client) {
	_ = h.server.DisconnectClient(existing, packets.ErrSessionTakenOver)
	h.server.UnsubscribeClient(existing)
	existing.ClearInflights()
	h.server.Clients.Delete(existing.ID)
	if h.cfg.OnDiscard != nil {
		h.cfg.OnDiscard(existing)
	}
}

// reserved reports whether a topic is the broker's own: $dlq/, $share/, $SYS/
// (in any case, as mochi matches $share and $SYS).
func reserved(topic string) bool {
	first, _, _ := strings.Cut(topic, "/")
	return strings.EqualFold(first, "$dlq") || strings.EqualFold(first, "$share") || strings.EqualFold(first, "$SYS")
}

// ReadPacket (a PacketReader step) makes a client's publish to $SYS/...
// meet the ACL check like any other reserved topic: mochi drops it before
// that check without an answer, so a QoS 1 publisher would wait for a PUBACK
// forever. The topic is renamed into $dlq/, which OnACLCheck refuses: 0x87
// for MQTT 5, a disconnect for 3.1.1, dropped and counted at QoS 0.
func (h *Auth) ReadPacket(cl *mqtt.Client, pk *packets.Packet) {
	if pk.FixedHeader.Type == packets.Publish && !cl.Net.Inline && len(pk.TopicName) >= 4 && strings.EqualFold(pk.TopicName[:4], "$SYS") {
		h.Log.Info("refusing a publish into $SYS", "client", clip(cl.ID), "topic", clip(pk.TopicName))
		pk.TopicName = "$dlq" + pk.TopicName[4:]
	}
}

// OnACLCheck reports whether the client may publish to (write) or subscribe
// to (read) topic.
func (h *Auth) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if cl.Net.Inline {
		return true // the broker's own clients
	}
	if write && reserved(topic) {
		h.ReservedRefused.Add(1)
		h.Log.Info("refused a publish into a reserved topic", "client", clip(cl.ID), "topic", clip(topic))
		return false
	}
	if !h.rules.Configured() {
		return true
	}
	ok := h.rules.allows(cl, topic, write)
	if !ok {
		h.Log.Debug("client denied by ACL", "client", clip(cl.ID), "username", clip(string(cl.Properties.Username)), "topic", clip(topic), "write", write)
	}
	return ok
}

// UserCanRead reports whether a client of username may read topic, by the
// ACL alone (rules that name a client id or an address do not match): what
// the console's topic stream shows for http-topic-user.
func (h *Auth) UserCanRead(username, topic string) bool { return h.UserMay(username, topic, false) }

// UserMay is UserCanRead for either access: write (publish) or read.
func (h *Auth) UserMay(username, topic string, write bool) bool {
	p := h.rules.policy.Load()
	return p == nil || p.Ledger == nil || p.acl.decide("", username, "", topic, write)
}

// CanRead reports whether cl may receive a message published on topic.
func (h *Auth) CanRead(cl *mqtt.Client, topic string) bool { return h.rules.CanRead(cl, topic) }

// EncodePacket (a PacketEncoder step) re-checks a resumed session's resent
// messages against the ACL when its CONNACK goes out (mochi resends them
// right after, unchecked): what the user may not read now is dropped from
// its inflight state. Without auth PacketEncoder skips it (the check is of
// ACL rules).
func (h *Auth) EncodePacket(cl *mqtt.Client, pk *packets.Packet) {
	if pk.FixedHeader.Type != packets.Connack {
		return
	}
	if _, refused := h.willRefused.LoadAndDelete(cl); refused {
		pk.ReasonCode = packets.ErrNotAuthorized.Code
		if cl.Properties.ProtocolVersion < 5 {
			pk.ReasonCode = packets.Err3NotAuthorized.Code
		}
		return
	}
	if !pk.SessionPresent || !h.rules.Configured() {
		return
	}
	for _, m := range cl.State.Inflight.GetAll(false) {
		if m.FixedHeader.Type == packets.Publish && !h.CanRead(cl, m.TopicName) {
			if cl.State.Inflight.Delete(m.PacketID) {
				atomic.AddInt64(&h.server.Info.Inflight, -1)
			}
			h.Log.Info("dropped a resent message the client may no longer read", "client", clip(cl.ID), "topic", clip(m.TopicName))
		}
	}
}
