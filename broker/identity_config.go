package broker

import (
	"fmt"
	"time"

	"github.com/keyline-mq/keyline/internal/enum"
)

// IdentityConfig is how devices prove who they are: client certificates on
// the TLS listeners (tls, wss), a password file, JSON Web Tokens.
// Everything here but the wss address is re-read on reload (reload.go).
type IdentityConfig struct {
	WSS string `yaml:"wss"` // MQTT over WebSocket over TLS (path /), with tls-cert and tls-key
	// TLSClientCA is a PEM bundle of the CAs that sign client certificates.
	TLSClientCA string `yaml:"tls-client-ca"`
	// TLSClientAuth: none (no client certificate asked), request (verified
	// when given) or require (a connection without a valid one is refused
	// in the handshake).
	TLSClientAuth TLSClientAuth `yaml:"tls-client-auth"`
	// TLSIdentity makes a verified client certificate's identity the MQTT
	// user name (no password checked): its subject's CN, first DNS or URI
	// subject alternative name; none: the certificate only lets the
	// connection in.
	TLSIdentity TLSIdentity `yaml:"tls-identity"`
	// TLSCRL is a PEM file of certificate revocation lists, each signed by a
	// CA of the bundle.
	TLSCRL string `yaml:"tls-crl"`
	// PasswordFile holds users and password hashes, a user a line (mosquitto's
	// format; keyline passwd writes it).
	PasswordFile string `yaml:"password-file"`
	// JWTKey is a PEM file of public keys (RSA or EC P-256) or a JWKS file
	// that verifies the JSON Web Tokens clients send as their password
	// (hooks/jwt.go).
	JWTKey string `yaml:"jwt-key"`
	// JWTACLClaim names the claim that may carry a token's own ACL; "": none.
	JWTACLClaim string `yaml:"jwt-acl-claim"`
	// ReloadWatch polls the files a reload reads (this config file, the
	// password file, TLS material, JWT keys) this often and reloads when one
	// has changed (reloadwatch.go); 0: only SIGHUP and the API reload.
	ReloadWatch time.Duration `yaml:"reload-watch"`
	// ConfigFile is the file the configuration was read from (set by the
	// command line's --config, not a key), watched with ReloadWatch.
	ConfigFile string `yaml:"-"`
}

// DefaultIdentityConfig is the identity part of DefaultConfig.
func DefaultIdentityConfig() IdentityConfig {
	return IdentityConfig{TLSClientAuth: ClientAuthNone, TLSIdentity: IdentityNone}
}

// authRequired reports whether clients must authenticate: an auth ledger,
// a password file, JWT keys or certificate identities are configured.
func (c *Config) authRequired() bool {
	return c.Auth != nil || c.PasswordFile != "" || c.JWTKey != "" || c.TLSIdentity != IdentityNone
}

func (c *Config) validateIdentity() error {
	tlsListener := c.TLS != "" || c.WSS != ""
	switch {
	case c.TLSClientAuth == 0:
		return fmt.Errorf("%w: tls-client-auth is not set (want %s)", ErrInvalidConfig, TLSClientAuths)
	case c.TLSIdentity == 0:
		return fmt.Errorf("%w: tls-identity is not set (want %s)", ErrInvalidConfig, TLSIdentities)
	case c.TLSClientAuth != ClientAuthNone && c.TLSClientCA == "":
		return fmt.Errorf("%w: tls-client-auth %s needs tls-client-ca (the CAs that sign client certificates)", ErrInvalidConfig, c.TLSClientAuth)
	case c.TLSClientCA != "" && c.TLSClientAuth == ClientAuthNone:
		return fmt.Errorf("%w: tls-client-ca is set but tls-client-auth is none (want request or require)", ErrInvalidConfig)
	case c.TLSClientCA != "" && !tlsListener:
		return fmt.Errorf("%w: tls-client-ca needs a tls or wss listener", ErrInvalidConfig)
	case c.TLSIdentity != IdentityNone && c.TLSClientAuth == ClientAuthNone:
		return fmt.Errorf("%w: tls-identity %s needs client certificates (tls-client-auth request or require)", ErrInvalidConfig, c.TLSIdentity)
	case c.TLSCRL != "" && c.TLSClientCA == "":
		return fmt.Errorf("%w: tls-crl needs tls-client-ca", ErrInvalidConfig)
	case c.JWTACLClaim != "" && c.JWTKey == "":
		return fmt.Errorf("%w: jwt-acl-claim needs jwt-key", ErrInvalidConfig)
	}
	if c.ReloadWatch < 0 || (c.ReloadWatch > 0 && c.ReloadWatch < 100*time.Millisecond) {
		return fmt.Errorf("%w: reload-watch %v is not 0 (off) or at least 100ms", ErrInvalidConfig, c.ReloadWatch)
	}
	return checkAddr("wss", c.WSS)
}

// TLSClientAuth is the tls-client-auth setting. The zero value means "not set".
type TLSClientAuth uint8

// The client certificate modes.
const (
	ClientAuthNone    TLSClientAuth = iota + 1 // no client certificate asked for
	ClientAuthRequest                          // verified when the client sends one
	ClientAuthRequire                          // a valid one is needed to connect
)

// TLSClientAuths names the modes, in value order.
var TLSClientAuths = enum.Names{"none", "request", "require"}

func (m TLSClientAuth) String() string { return TLSClientAuths.Name(uint8(m)) }

// UnmarshalText parses the mode from YAML and other text formats.
func (m *TLSClientAuth) UnmarshalText(b []byte) error {
	v, err := TLSClientAuths.Parse("tls-client-auth", string(b), ErrInvalidConfig)
	if err == nil {
		*m = TLSClientAuth(v)
	}
	return err
}

// MarshalText prints the mode's name.
func (m TLSClientAuth) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// Set makes *TLSClientAuth a flag value (pflag.Value).
func (m *TLSClientAuth) Set(s string) error { return m.UnmarshalText([]byte(s)) }

// Type names the flag's value type in --help.
func (m *TLSClientAuth) Type() string { return "mode" }

// TLSIdentity is the tls-identity setting. The zero value means "not set".
type TLSIdentity uint8

// What of a client certificate becomes the user name.
const (
	IdentityNone   TLSIdentity = iota + 1 // nothing: the user name is the CONNECT's
	IdentityCN                            // the subject's common name
	IdentitySANDNS                        // the first DNS subject alternative name
	IdentitySANURI                        // the first URI subject alternative name
)

// TLSIdentities names the identities, in value order.
var TLSIdentities = enum.Names{"none", "cn", "san-dns", "san-uri"}

func (m TLSIdentity) String() string { return TLSIdentities.Name(uint8(m)) }

// UnmarshalText parses the identity from YAML and other text formats.
func (m *TLSIdentity) UnmarshalText(b []byte) error {
	v, err := TLSIdentities.Parse("tls-identity", string(b), ErrInvalidConfig)
	if err == nil {
		*m = TLSIdentity(v)
	}
	return err
}

// MarshalText prints the identity's name.
func (m TLSIdentity) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// Set makes *TLSIdentity a flag value (pflag.Value).
func (m *TLSIdentity) Set(s string) error { return m.UnmarshalText([]byte(s)) }

// Type names the flag's value type in --help.
func (m *TLSIdentity) Type() string { return "identity" }
