package broker

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/keyline-mq/keyline/hooks"
	"github.com/keyline-mq/keyline/internal/passwd"
)

// newTLSServer loads the TLS material of cfg; nil without a tls or wss listener.
func newTLSServer(cfg *Config, log *slog.Logger) (*tlsServer, error) {
	if cfg.TLS == "" && cfg.WSS == "" {
		return nil, nil
	}
	m, err := loadTLSMaterial(cfg)
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	t := &tlsServer{log: log}
	t.cur.Store(m)
	return t, nil
}

// authPolicy builds the auth policy of cfg: the ledger, the password file's
// users, the JWT keys. Plain-text passwords are logged, one warning naming the users.
func authPolicy(cfg *Config, log *slog.Logger) (*hooks.AuthPolicy, error) {
	var file *passwd.File
	if cfg.PasswordFile != "" {
		var err error
		if file, err = passwd.ReadFile(cfg.PasswordFile); err != nil {
			return nil, err
		}
	}
	creds, err := hooks.NewCredentials(cfg.Auth, file)
	if err != nil {
		return nil, err
	}
	if cfg.JWTKey != "" {
		if creds.JWT, err = hooks.LoadJWTKeys(cfg.JWTKey, cfg.JWTACLClaim); err != nil {
			return nil, fmt.Errorf("jwt-key %w", err)
		}
	}
	if n := len(creds.PlainUsers); n > 0 {
		users := creds.PlainUsers[:min(n, 20)]
		log.Warn("passwords stored in plain text: replace them with hashes (keyline passwd writes a password file)",
			"users", strings.Join(users, ", "), "count", n)
	}
	return hooks.NewAuthPolicy(cfg.Auth, creds, cfg.authRequired()), nil
}
