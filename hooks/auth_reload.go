package hooks

import (
	"errors"
	"slices"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
)

// clientAuth is what Auth keeps of a connected client: how it
// authenticated, under which policy.
type clientAuth struct {
	authn
	policy *AuthPolicy
	expiry *time.Timer // a token's: disconnects the client when it expires
}

// OnDisconnect forgets how the client authenticated.
func (h *Auth) OnDisconnect(cl *mqtt.Client, _ error, _ bool) {
	h.rules.forget(cl)
	if v, ok := h.clients.LoadAndDelete(cl); ok && v.(*clientAuth).expiry != nil {
		v.(*clientAuth).expiry.Stop()
	}
}

// tokenExpired disconnects a client whose token has expired (MQTT 5:
// DISCONNECT 0xA0 Maximum connect time).
func (h *Auth) tokenExpired(cl *mqtt.Client) {
	if cl.Closed() {
		return
	}
	h.Log.Info("disconnecting a client whose token expired", "client", clip(cl.ID), "username", clip(string(cl.Properties.Username)), "remote", cl.Net.Remote)
	h.TokensExpired.Add(1)
	_ = h.server.DisconnectClient(cl, packets.ErrMaxConnectTime)
}

// OnSessionEstablished re-checks a client that authenticated under a
// policy that a reload has replaced since (it was not among the clients the
// reload saw).
func (h *Auth) OnSessionEstablished(cl *mqtt.Client, _ packets.Packet) {
	v, ok := h.clients.Load(cl)
	if !ok {
		return
	}
	if p := h.Policy(); v.(*clientAuth).policy != p {
		var r ReloadReport
		h.recheck(p, cl, &r)
	}
}

// ReloadReport says what a reload of the auth policy did to clients.
type ReloadReport struct {
	// Disconnected are the connected clients cut off: their user is gone,
	// disallowed or has another password, or the auth rule that let them in
	// is gone.
	Disconnected []string
	// Unsubscribed counts subscriptions removed because the ACL no longer
	// allows them (connected clients and stored sessions alike).
	Unsubscribed int
}

// ErrAuthToggle is returned by Reload for a policy that would turn
// authentication on or off: that takes a restart.
var ErrAuthToggle = errors.New("hooks: turning authentication on or off needs a restart")

// Reload puts p in force and re-checks every client against it:
//   - a connected client whose credentials no longer hold is cut off
//     (DISCONNECT 0x87 Not authorized; 3.1.1: the connection is closed);
//   - a client, connected or with a stored session, loses the subscriptions
//     the new ACL does not allow (it is not told: MQTT has no server-side
//     UNSUBSCRIBE); publishes are checked as they come, so lost publish
//     rights take effect at once.
//
// A SUBSCRIBE being checked in the moment of the swap may still be decided
// by the old policy.
func (h *Auth) Reload(p *AuthPolicy) (ReloadReport, error) {
	if p.Required != h.Policy().Required {
		return ReloadReport{}, ErrAuthToggle
	}
	h.rules.policy.Store(p) // every ACL check, the fan-out's and Key-Shared's too, applies p from here on
	var r ReloadReport
	if !p.Required {
		return r, nil
	}
	for _, cl := range h.server.Clients.GetAll() {
		if !cl.Net.Inline {
			h.recheck(p, cl, &r)
		}
	}
	slices.Sort(r.Disconnected)
	return r, nil
}

// recheck applies p to one client.
func (h *Auth) recheck(p *AuthPolicy, cl *mqtt.Client, r *ReloadReport) {
	if v, ok := h.clients.Load(cl); ok && !cl.Closed() {
		a := v.(*clientAuth)
		if !h.stillValid(p, a, cl) {
			h.Log.Warn("disconnecting a client whose credentials a reload removed", "client", clip(cl.ID),
				"username", clip(string(cl.Properties.Username)), "remote", cl.Net.Remote)
			r.Disconnected = append(r.Disconnected, cl.ID)
			if a.expiry != nil {
				a.expiry.Stop()
			}
			h.clients.Delete(cl)
			h.rules.forget(cl)
			_ = h.server.DisconnectClient(cl, packets.ErrNotAuthorized)
			return
		}
		h.clients.Store(cl, &clientAuth{authn: a.authn, policy: p, expiry: a.expiry})
	}
	var lost []string
	for filter := range cl.State.Subscriptions.GetAll() {
		if !h.OnACLCheck(cl, filter, false) {
			lost = append(lost, filter)
		}
	}
	if len(lost) == 0 {
		return
	}
	slices.Sort(lost)
	n := h.server.UnsubscribeFilters(cl, lost)
	r.Unsubscribed += n
	h.Log.Info("removed subscriptions a reload no longer allows", "client", clip(cl.ID),
		"username", clip(string(cl.Properties.Username)), "filters", len(lost), "first", clip(lost[0]))
}

func (h *Auth) stillValid(p *AuthPolicy, a *clientAuth, cl *mqtt.Client) bool {
	if p.Credentials == nil {
		return a.kind == authnCert
	}
	return p.Credentials.stillValid(a.authn, cl.ID, cl.Net.Remote)
}
