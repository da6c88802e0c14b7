package ops

import (
	"net/http"
	"net/http/pprof"
)

// registerDebug serves Go's profiler under /debug/pprof/ on the HTTP
// listener (loopback by default), for operators chasing CPU or memory.
func registerDebug(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}
