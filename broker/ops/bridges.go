package ops

import (
	"fmt"
	"net/http"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// registerBridges serves the bridges' views.
func (b *Service) registerBridges(mux *http.ServeMux) {
	mux.HandleFunc("GET "+adminapi.PathBridges, func(w http.ResponseWriter, r *http.Request) {
		if _, err := queryParams(r); err != nil {
			badRequest(w, err)
			return
		}
		writeJSON(w, http.StatusOK, adminapi.BridgeList{Bridges: b.b.Bridges()})
	})
	mux.HandleFunc("GET "+adminapi.PathBridges+"/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		for _, v := range b.b.Bridges() {
			if v.Name == name {
				writeJSON(w, http.StatusOK, v)
				return
			}
		}
		writeJSON(w, http.StatusNotFound, adminapi.Error{Error: fmt.Sprintf("no bridge named %q", name)})
	})
}
