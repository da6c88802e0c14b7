package ops

import (
	"net"
	"net/http"
	"strings"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// hostCheck refuses requests whose Host header names neither an IP address,
// nor localhost, nor one of http-allowed-hosts: a web page an operator opens
// could otherwise point a DNS name of its own at the broker's address (DNS
// rebinding) and read the admin API, or /metrics (whose labels name groups
// and share names), as the same origin. /healthz and /readyz, which say
// nothing, are left open to probes that address the broker by any name.
func (b *Service) hostCheck(next http.Handler) http.Handler {
	allowed := map[string]bool{"localhost": true}
	for _, h := range b.cfg.AllowedHosts {
		allowed[strings.ToLower(h)] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if probePaths[r.URL.Path] || hostAllowed(r.Host, allowed) {
			next.ServeHTTP(w, r)
			return
		}
		b.log.Warn("refused an HTTP request for an unknown Host (add it to http-allowed-hosts if it is yours)", "host", clipHeader(r.Host), "path", r.URL.Path, "remote", r.RemoteAddr)
		writeJSON(w, http.StatusForbidden, adminapi.Error{Error: "Host " + clipHeader(r.Host) + " is not allowed: add it to http-allowed-hosts"})
	})
}

// probePaths answer any Host: they reveal nothing but whether the broker runs.
var probePaths = map[string]bool{"/healthz": true, "/readyz": true}

// hostAllowed reports whether a Host header (host[:port]) is an IP literal,
// localhost, or in allowed.
func hostAllowed(hostport string, allowed map[string]bool) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	return net.ParseIP(host) != nil || allowed[host] || allowed[strings.ToLower(hostport)]
}

// clipHeader shortens a client-sent header value for logs and errors.
func clipHeader(s string) string {
	if len(s) > 100 {
		return s[:100] + "..."
	}
	return s
}
