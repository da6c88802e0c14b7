package ops

import (
	"net/http"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// POST /api/v1/clients/{id}/disconnect.

func (b *Service) handleDisconnect(w http.ResponseWriter, r *http.Request) {
	if _, err := queryParams(r); err != nil {
		badRequest(w, err)
		return
	}
	res, err := b.disconnect(r.PathValue("id"), r.RemoteAddr)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// disconnect ends a connected client's connection (MQTT 5 clients get
// DISCONNECT 0x98, administrative action); its persistent session, if any,
// stays. remote names who asked, for the log.
func (b *Service) disconnect(id, remote string) (adminapi.DisconnectResult, error) {
	kept, err := b.b.Disconnect(id)
	if err != nil {
		return adminapi.DisconnectResult{}, err
	}
	b.log.Info("disconnected a client through the admin API", "client", id, "session_kept", kept, "remote", remote)
	return adminapi.DisconnectResult{Disconnected: id, SessionKept: kept}, nil
}
