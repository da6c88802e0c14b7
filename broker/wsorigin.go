package broker

import (
	"net/http"
	"net/url"
	"strings"
)

// originAllowed reports whether a WebSocket upgrade may go ahead: clients
// that send no Origin (devices, libraries) may; browsers may from the same
// host, or from an origin listed in ws-allowed-origins ("*" allows any).
func originAllowed(r *http.Request, allowed []string) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return true
	}
	for _, a := range allowed {
		if a == "*" || strings.EqualFold(a, origin) {
			return true
		}
	}
	u, err := url.Parse(origin)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}
