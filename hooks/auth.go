package hooks

import (
	"bytes"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/keyline-mq/keyline/internal/share"
)

// Auth authenticates clients and checks topic access against a mochi auth
// ledger (users, auth rules, ACL rules; mochi's ledger format).
//
// Unlike mochi's own ledger hook it checks a shared subscription
// `$share/<group>/<filter>` against the rules for `<filter>`, as a user writes
// them: a rule for `orders/#` governs `$share/workers/orders/#` too.
type Auth struct {
	mqtt.HookBase
	ledger *auth.Ledger
}

// NewAuth returns an auth hook over ledger.
func NewAuth(ledger *auth.Ledger) *Auth { return &Auth{ledger: ledger} }

// ID returns the hook's id.
func (h *Auth) ID() string { return "keyline-auth" }

// Provides reports which hook methods Auth implements.
func (h *Auth) Provides(b byte) bool {
	return bytes.Contains([]byte{mqtt.OnConnectAuthenticate, mqtt.OnACLCheck}, []byte{b})
}

// OnConnectAuthenticate reports whether the ledger lets the client connect.
func (h *Auth) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	if _, ok := h.ledger.AuthOk(cl, pk); ok {
		return true
	}
	h.Log.Info("client failed authentication", "client", cl.ID, "username", string(pk.Connect.Username), "remote", cl.Net.Remote)
	return false
}

// OnACLCheck reports whether the client may publish to (write) or subscribe
// to (read) topic.
func (h *Auth) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if !write {
		if n, shared, err := share.ParseSubscription(topic); shared && err == nil {
			topic = n.Filter
		}
	}
	if _, ok := h.ledger.ACLOk(cl, topic, write); ok {
		return true
	}
	h.Log.Debug("client denied by ACL", "client", cl.ID, "username", string(cl.Properties.Username), "topic", topic, "write", write)
	return false
}
