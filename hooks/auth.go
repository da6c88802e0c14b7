package hooks

import (
	"bytes"
	"errors"
	"strings"
	"sync/atomic"

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
	ledger *auth.Ledger // nil: no auth configured
	rules  *ACL
	cfg    AuthConfig
	// ReservedRefused counts publishes into reserved topics, refused.
	ReservedRefused atomic.Uint64
	// Refused counts CONNECTs refused for taking another user's client id.
	Refused atomic.Uint64
}

// AuthConfig configures an auth hook.
type AuthConfig struct {
	// FreshSessions: a CONNECT with another user's client id discards that
	// session and starts afresh instead of being refused.
	FreshSessions bool
	// OnDiscard (nil: none) is told of a session discarded for
	// FreshSessions (so that stored state goes with it).
	OnDiscard func(cl *mqtt.Client)
}

// NewAuth returns an auth hook over rules (NewACL(nil): allow every client).
func NewAuth(server *mqtt.Server, rules *ACL, cfg AuthConfig) *Auth {
	return &Auth{server: server, ledger: rules.ledger, rules: rules, cfg: cfg}
}

// ID returns the hook's id.
func (h *Auth) ID() string { return "keyline-auth" }

// Provides reports which hook methods Auth implements.
func (h *Auth) Provides(b byte) bool { return authEvents.has(b) }

var authEvents = eventSet(
	mqtt.OnConnectAuthenticate, mqtt.OnACLCheck,
)

// OnConnectAuthenticate reports whether the ledger lets the client connect,
// and keeps a client id to the user whose session it is.
func (h *Auth) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	if h.ledger == nil {
		return true
	}
	if _, ok := h.ledger.AuthOk(cl, pk); !ok {
		h.Log.Info("client failed authentication", "client", clip(cl.ID), "username", clip(string(pk.Connect.Username)), "remote", cl.Net.Remote)
		return false
	}
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
	code := packets.ErrNotAuthorized.Code
	if cl.Properties.ProtocolVersion < 5 {
		code = packets.Err3NotAuthorized.Code
	}
	_ = cl.WritePacket(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connack}, ReasonCode: code})
	cl.Stop(errClientIDTaken)
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
	if h.ledger == nil {
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
	return h.ledger == nil || h.rules.acl.decide("", username, "", topic, write)
}

// CanRead reports whether cl may receive a message published on topic.
func (h *Auth) CanRead(cl *mqtt.Client, topic string) bool { return h.rules.CanRead(cl, topic) }

// EncodePacket (a PacketEncoder step) re-checks a resumed session's resent
// messages against the ACL when its CONNACK goes out (mochi resends them
// right after, unchecked): what the user may not read now is dropped from
// its inflight state. Without a ledger PacketEncoder skips it (the check is
// of ACL rules).
func (h *Auth) EncodePacket(cl *mqtt.Client, pk *packets.Packet) {
	if pk.FixedHeader.Type != packets.Connack || !pk.SessionPresent || h.ledger == nil {
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
