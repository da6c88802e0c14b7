package broker

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"

	"github.com/keyline-mq/keyline/internal/connq"
)

// tlsMaterial is the TLS configuration of the tls and wss listeners at one
// time: the server certificate, the client CAs and revocation lists. A
// reload builds a new one and swaps it in whole (tlsServer.cur); handshakes
// already done keep theirs, so connections stay up.
type tlsMaterial struct {
	conf    *tls.Config
	leaf    *x509.Certificate   // the server certificate
	cas     []*x509.Certificate // the client CA bundle (nil without tls-client-ca)
	pool    *x509.CertPool
	revoked map[string]map[string]bool // issuer (raw subject) -> serial (decimal) -> revoked
	crlNext time.Time                  // earliest NextUpdate of the CRLs (zero: none)
	mode    TLSClientAuth
}

// tlsServer serves the TLS material in force to every handshake.
type tlsServer struct {
	cur     atomic.Pointer[tlsMaterial]
	log     *slog.Logger
	refused [refusalKinds]atomic.Uint64 // client certificates refused, by reason
}

// Reasons a client certificate is refused, for keyline_tls_client_certificates_refused_total.
const (
	refusedExpired = iota
	refusedUntrusted
	refusedRevoked
	refusedOther
	refusalKinds
)

var refusalNames = [refusalKinds]string{"expired", "untrusted", "revoked", "other"}

// loadTLSMaterial reads the certificate files of cfg.
func loadTLSMaterial(cfg *Config) (*tlsMaterial, error) {
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("tls-cert %s / tls-key %s: %w", cfg.TLSCert, cfg.TLSKey, err)
	}
	m := &tlsMaterial{leaf: cert.Leaf, mode: cfg.TLSClientAuth}
	if m.leaf == nil {
		if m.leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("tls-cert %s: %w", cfg.TLSCert, err)
		}
	}
	m.conf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if cfg.TLSClientCA == "" {
		return m, nil
	}
	if m.cas, err = readCerts(cfg.TLSClientCA); err != nil {
		return nil, fmt.Errorf("tls-client-ca %s: %w", cfg.TLSClientCA, err)
	}
	m.pool = x509.NewCertPool()
	for _, ca := range m.cas {
		m.pool.AddCert(ca)
	}
	if cfg.TLSCRL != "" {
		if err := m.loadCRLs(cfg.TLSCRL); err != nil {
			return nil, fmt.Errorf("tls-crl %s: %w", cfg.TLSCRL, err)
		}
	}
	// Keyline verifies the certificate itself (verifyClient), so that a
	// refusal can be logged and counted by its reason and checked against
	// the revocation lists; the handshake only asks for one.
	m.conf.ClientAuth = tls.RequestClientCert
	if cfg.TLSClientAuth == ClientAuthRequire {
		m.conf.ClientAuth = tls.RequireAnyClientCert
	}
	m.conf.ClientCAs = m.pool // named in the CertificateRequest, so clients pick the right certificate
	return m, nil
}

// readCerts reads every CERTIFICATE block of a PEM file.
func readCerts(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for n := 1; ; n++ {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM CERTIFICATE in it")
	}
	return out, nil
}

// loadCRLs reads every X509 CRL block of a PEM file (DER as a fallback);
// each must be signed by a CA of the bundle.
func (m *tlsMaterial) loadCRLs(path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var ders [][]byte
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "X509 CRL" {
			ders = append(ders, b.Bytes)
		}
	}
	if len(ders) == 0 {
		ders = [][]byte{data} // a DER file
	}
	m.revoked = map[string]map[string]bool{}
	for i, der := range ders {
		crl, err := x509.ParseRevocationList(der)
		if err != nil {
			return fmt.Errorf("CRL %d: %w", i+1, err)
		}
		var signer *x509.Certificate
		for _, ca := range m.cas {
			if crl.CheckSignatureFrom(ca) == nil {
				signer = ca
				break
			}
		}
		if signer == nil {
			return fmt.Errorf("CRL %d (issuer %s) is not signed by a CA of tls-client-ca", i+1, crl.Issuer)
		}
		serials := m.revoked[string(crl.RawIssuer)]
		if serials == nil {
			serials = map[string]bool{}
			m.revoked[string(crl.RawIssuer)] = serials
		}
		for _, e := range crl.RevokedCertificateEntries {
			serials[e.SerialNumber.String()] = true
		}
		if !crl.NextUpdate.IsZero() && (m.crlNext.IsZero() || crl.NextUpdate.Before(m.crlNext)) {
			m.crlNext = crl.NextUpdate
		}
	}
	return nil
}

// isRevoked reports whether c is on a revocation list of its issuer.
func (m *tlsMaterial) isRevoked(c *x509.Certificate) bool {
	return m.revoked[string(c.RawIssuer)][serialString(c.SerialNumber)]
}

func serialString(n *big.Int) string {
	if n == nil {
		return ""
	}
	return n.String()
}

// listenerConfig is the tls.Config of a listener: every handshake takes the
// material in force at its start.
func (t *tlsServer) listenerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			m := t.cur.Load()
			if m.pool == nil {
				return m.conf, nil
			}
			c := m.conf.Clone()
			remote := ""
			if hello.Conn != nil {
				remote = hello.Conn.RemoteAddr().String()
			}
			c.VerifyConnection = func(cs tls.ConnectionState) error { return t.verifyClient(m, cs, remote) }
			return c, nil
		},
	}
}

// verifyClient verifies a client certificate against the CA bundle and the
// revocation lists. Without one it passes (require mode has refused the
// handshake already).
func (t *tlsServer) verifyClient(m *tlsMaterial, cs tls.ConnectionState, remote string) error {
	if len(cs.PeerCertificates) == 0 {
		return nil
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: m.pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	reason := refusedOther
	switch {
	case err == nil:
		for _, c := range chains[0][:len(chains[0])-1] { // the root is trusted as it is
			if m.isRevoked(c) {
				reason, err = refusedRevoked, fmt.Errorf("certificate serial %s of %s is revoked", serialString(c.SerialNumber), c.Subject)
				break
			}
		}
	case errors.As(err, new(x509.UnknownAuthorityError)):
		reason = refusedUntrusted
	case isExpired(err):
		reason = refusedExpired
	}
	if err == nil {
		return nil
	}
	t.refused[reason].Add(1)
	t.log.Info("refused a client certificate", "reason", refusalNames[reason], "subject", clip(leaf.Subject.String()),
		"serial", serialString(leaf.SerialNumber), "remote", remote, "error", err)
	return err
}

func isExpired(err error) bool {
	var ce x509.CertificateInvalidError
	return errors.As(err, &ce) && ce.Reason == x509.Expired
}

// clip shortens a client-controlled string (a certificate's subject, a
// client id) for a log line.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// peerCertificate returns the verified leaf certificate a client sent over
// a tls or wss listener, or nil.
func peerCertificate(c net.Conn) *x509.Certificate {
	for range 4 { // connq.Conn -> wsConn -> tls.Conn
		switch v := c.(type) {
		case *connq.Conn:
			c = v.Conn
		case *wsConn:
			c = v.Conn
		case *tls.Conn:
			if cs := v.ConnectionState(); cs.HandshakeComplete && len(cs.PeerCertificates) > 0 {
				return cs.PeerCertificates[0]
			}
			return nil
		default:
			return nil
		}
	}
	return nil
}

// identityOf is the auth hook's Identity: the user name a client's verified
// certificate gives under mode, on the tls and wss listeners. ok is false
// without a certificate; a certificate without the named field gives "" (refused).
func identityOf(mode TLSIdentity, cl *mqtt.Client) (string, bool) {
	if mode == IdentityNone || (cl.Net.Listener != "tls" && cl.Net.Listener != "wss") {
		return "", false
	}
	leaf := peerCertificate(cl.Net.Conn)
	if leaf == nil {
		return "", false
	}
	switch mode {
	case IdentityCN:
		return leaf.Subject.CommonName, true
	case IdentitySANDNS:
		if len(leaf.DNSNames) > 0 {
			return leaf.DNSNames[0], true
		}
	case IdentitySANURI:
		if len(leaf.URIs) > 0 {
			return leaf.URIs[0].String(), true
		}
	}
	return "", true
}
