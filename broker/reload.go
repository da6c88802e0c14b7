package broker

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyline-mq/keyline/broker/ops"
	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/adminapi"
)

// reloads is the broker's live reload (SIGHUP, POST /api/v1/reload): it
// re-reads the auth users and ACL rules, the password file, the TLS
// material (server certificate, client CAs, revocation lists) and the rate
// limits, and applies them all or none.
type reloads struct {
	mu sync.Mutex // one reload at a time
	// source gives the configuration a reload applies (the binary re-reads
	// its config file and flags); nil: the running one, its files re-read.
	source  func() (Config, error)
	last    Config // the configuration the last reload applied (guarded by mu)
	ok, bad atomic.Uint64
	// identity is the tls-identity in force (a TLSIdentity).
	identity atomic.Uint32
}

// SetReloadSource makes Reload read its configuration from f.
func (b *Broker) SetReloadSource(f func() (Config, error)) {
	b.reload.mu.Lock()
	b.reload.source = f
	b.reload.mu.Unlock()
}

// errReload marks a reload refused for what the new configuration holds
// (the API answers 422).
var errReload = errors.New("reload refused")

// Reload re-reads the configuration (SetReloadSource) and applies its users,
// password file, ACL rules and TLS material, or, if any of them does not
// load, nothing: the error names the file (and line) at fault. Connected
// clients keep their connection unless the new rules remove their right to
// it (see hooks.Auth.Reload); a client whose certificate the new
// revocation lists name is cut off. Other changed settings are reported in
// NeedRestart and not applied.
func (b *Broker) Reload() (adminapi.ReloadResult, error) {
	r := &b.reload
	r.mu.Lock()
	defer r.mu.Unlock()
	res, err := b.reloadLocked()
	if err != nil {
		r.bad.Add(1)
		b.log.Error("reload failed: the running configuration is unchanged", "error", err)
		return res, err
	}
	r.ok.Add(1)
	b.log.Info("configuration reloaded", "disconnected", len(res.Disconnected), "unsubscribed", res.Unsubscribed, "need_restart", res.NeedRestart)
	return res, nil
}

func (b *Broker) reloadLocked() (adminapi.ReloadResult, error) {
	var res adminapi.ReloadResult
	next := b.reload.last
	if b.reload.source != nil {
		var err error
		if next, err = b.reload.source(); err != nil {
			return res, fmt.Errorf("%w: %w", errReload, err)
		}
	}
	if err := next.Validate(); err != nil {
		return res, fmt.Errorf("%w: %w", errReload, err)
	}
	if next.authRequired() != b.auth.Policy().Required {
		return res, fmt.Errorf("%w: %w", errReload, hooks.ErrAuthToggle)
	}
	policy, err := authPolicy(&next, b.log)
	if err != nil {
		return res, fmt.Errorf("%w: %w", errReload, err)
	}
	var material *tlsMaterial
	if b.tls != nil {
		if material, err = loadTLSMaterial(&next); err != nil {
			return res, fmt.Errorf("%w: %w", errReload, err)
		}
	}
	// Everything loaded: put it in force.
	res.NeedRestart = restartOnly(&b.reload.last, &next)
	if material != nil {
		b.tls.cur.Store(material)
	}
	b.reload.identity.Store(uint32(next.TLSIdentity))
	b.rates.Set(next.RateLimits.settings())
	rep, err := b.auth.Reload(policy)
	if err != nil {
		return res, fmt.Errorf("%w: %w", errReload, err)
	}
	res.Disconnected, res.Unsubscribed = rep.Disconnected, rep.Unsubscribed
	if b.groups != nil {
		b.groups.ReadAccessChanged() // what a holder on another node was refused may be allowed now
	}
	if material != nil {
		res.Disconnected = append(res.Disconnected, b.dropRevoked(material)...)
		slices.Sort(res.Disconnected)
	}
	kept := next
	for _, f := range res.NeedRestart { // what was not applied stays as it runs
		reflect.ValueOf(&kept).Elem().FieldByName(f).Set(reflect.ValueOf(b.reload.last).FieldByName(f))
	}
	b.reload.last = kept
	return res, nil
}

// dropRevoked disconnects the clients whose certificate m revokes.
func (b *Broker) dropRevoked(m *tlsMaterial) []string {
	if m.revoked == nil {
		return nil
	}
	var out []string
	for _, cl := range b.server.Clients.GetAll() {
		if cl.Closed() || cl.Net.Inline {
			continue
		}
		leaf := peerCertificate(cl.Net.Conn)
		if leaf == nil || !m.isRevoked(leaf) {
			continue
		}
		b.log.Warn("disconnecting a client whose certificate a reload revoked", "client", clip(cl.ID),
			"subject", clip(leaf.Subject.String()), "serial", serialString(leaf.SerialNumber), "remote", cl.Net.Remote)
		out = append(out, cl.ID)
		_ = b.server.DisconnectClient(cl, packets.ErrNotAuthorized)
	}
	return out
}

// reloadable are the Config fields a reload applies.
var reloadable = map[string]bool{"Auth": true, "TLSCert": true, "TLSKey": true, "RateLimits": true}

// restartOnly names the top-level Config fields (the identity settings
// one by one) that differ between was and next and that a reload does not
// apply.
func restartOnly(was, next *Config) []string {
	var out []string
	a, z := reflect.ValueOf(*was), reflect.ValueOf(*next)
	for i := range a.NumField() {
		f := a.Type().Field(i)
		switch {
		case f.Name == "IdentityConfig":
			if was.WSS != next.WSS {
				out = append(out, "WSS")
			}
			if was.ReloadWatch != next.ReloadWatch {
				out = append(out, "ReloadWatch")
			}
		case reloadable[f.Name]:
		case !reflect.DeepEqual(a.Field(i).Interface(), z.Field(i).Interface()):
			out = append(out, f.Name)
		}
	}
	return out
}

func (b *Broker) certIdentity(cl *mqtt.Client) (string, bool) {
	return identityOf(TLSIdentity(b.reload.identity.Load()), cl)
}

// registerReload serves POST /api/v1/reload (behind the admin token).
func (b *Broker) registerReload(mux *http.ServeMux) {
	mux.HandleFunc("POST "+adminapi.PathReload, func(w http.ResponseWriter, r *http.Request) {
		res, err := b.Reload()
		switch {
		case errors.Is(err, errReload):
			ops.WriteJSON(w, http.StatusUnprocessableEntity, adminapi.Error{Error: err.Error()})
		case err != nil:
			ops.WriteJSON(w, http.StatusInternalServerError, adminapi.Error{Error: err.Error()})
		default:
			ops.WriteJSON(w, http.StatusOK, res)
		}
	})
}

// identityCollector exports reloads, the TLS certificates' expiry, the
// client certificates refused and the clients whose token expired.
type identityCollector struct{ b *Broker }

var (
	reloadsDesc = prometheus.NewDesc("keyline_config_reloads_total",
		"Configuration reloads (SIGHUP, POST /api/v1/reload), by result: ok, or error (nothing changed).", []string{"result"}, nil)
	certExpiryDesc = prometheus.NewDesc("keyline_tls_certificate_expiry_seconds",
		"Seconds until the TLS listener's server certificate expires (negative: expired); certificate=server, or client_ca for the earliest-expiring CA of tls-client-ca.",
		[]string{"listener", "certificate"}, nil)
	tokensExpiredDesc = prometheus.NewDesc("keyline_jwt_expired_disconnects_total",
		"Clients disconnected (MQTT 5: 0xA0) when the JWT they connected with expired.", nil, nil)
	certRefusedDesc = prometheus.NewDesc("keyline_tls_client_certificates_refused_total",
		"TLS handshakes refused for the client certificate, by reason: expired, untrusted, revoked, other.", []string{"reason"}, nil)
)

func (c identityCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- reloadsDesc
	ch <- certExpiryDesc
	ch <- certRefusedDesc
	ch <- tokensExpiredDesc
}

func (c identityCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.b
	ch <- prometheus.MustNewConstMetric(reloadsDesc, prometheus.CounterValue, float64(b.reload.ok.Load()), "ok")
	ch <- prometheus.MustNewConstMetric(reloadsDesc, prometheus.CounterValue, float64(b.reload.bad.Load()), "error")
	ch <- prometheus.MustNewConstMetric(tokensExpiredDesc, prometheus.CounterValue, float64(b.auth.TokensExpired.Load()))
	if b.tls == nil {
		return
	}
	m := b.tls.cur.Load()
	now := time.Now()
	var ca *x509.Certificate
	for _, c := range m.cas {
		if ca == nil || c.NotAfter.Before(ca.NotAfter) {
			ca = c
		}
	}
	for _, ln := range b.mqttLns {
		if ln.proto != "tls" && ln.proto != "wss" {
			continue
		}
		ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, m.leaf.NotAfter.Sub(now).Seconds(), ln.id, "server")
		if ca != nil {
			ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, ca.NotAfter.Sub(now).Seconds(), ln.id, "client_ca")
		}
	}
	for i, name := range refusalNames {
		ch <- prometheus.MustNewConstMetric(certRefusedDesc, prometheus.CounterValue, float64(b.tls.refused[i].Load()), name)
	}
}
