package console

import (
	"net"
	"sync"
	"time"
)

// Login attempts: a client address that sent loginFailures wrong tokens
// within loginWindow is refused (429) until the window has passed, so the
// token cannot be guessed at the speed of the network. At most
// loginAddresses addresses are tracked; past that the table starts over
// (memory stays bounded whatever a flood of addresses does).
const (
	loginFailures  = 10
	loginWindow    = time.Minute
	loginAddresses = 4096
)

type loginLimiter struct {
	mu  sync.Mutex
	now func() time.Time
	m   map[string]*loginRecord
}

type loginRecord struct {
	since    time.Time // start of the window
	failures int
}

// host is the address part of a RemoteAddr ("ip:port").
func host(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// blocked reports how long remote must wait before trying again (0: it may try now).
func (l *loginLimiter) blocked(remote string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.m[host(remote)]
	if r == nil || r.failures < loginFailures {
		return 0
	}
	if wait := loginWindow - l.now().Sub(r.since); wait > 0 {
		return wait
	}
	delete(l.m, host(remote))
	return 0
}

// failed records a wrong token from remote.
func (l *loginLimiter) failed(remote string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	h := host(remote)
	r := l.m[h]
	if r == nil || now.Sub(r.since) > loginWindow {
		if l.m == nil || len(l.m) >= loginAddresses {
			l.m = map[string]*loginRecord{}
		}
		r = &loginRecord{since: now}
		l.m[h] = r
	}
	r.failures++
}
