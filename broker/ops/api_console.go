package ops

import (
	"errors"
	"net/http"

	"github.com/keyline-mq/keyline/broker/console"
	"github.com/keyline-mq/keyline/internal/adminapi"
)

// The routes the web console added to /api/v1 (the CLI and scripts may use
// them too), and the console itself at /, all behind adminHandler.

// registerConsole adds the console's API routes and pages to mux.
func (b *Service) registerConsole(mux *http.ServeMux, groups *groupAdmin, auth *console.Auth) {
	mux.HandleFunc("GET "+adminapi.PathOverview, b.handleOverview)
	mux.HandleFunc("GET "+adminapi.PathGroupMessages, groups.handleGroupMessages)
	mux.HandleFunc("GET "+adminapi.PathGroupActivity, groups.handleGroupActivity)
	mux.HandleFunc("POST "+adminapi.PathClients+"/{id}/disconnect", b.handleDisconnect)
	mux.HandleFunc("GET "+adminapi.PathTopicStream, b.handleTopicStream)
	console.New(&consoleBackend{b: b, groups: groups}, console.Options{
		Auth:   auth,
		Logger: b.log.With("component", "console"),
	}).Register(mux)
}

// statusError turns an error of an operation on group (and dead letter id)
// into the API's answer.
func (a *groupAdmin) statusError(err error, group string, id uint64) *adminapi.StatusError {
	status, msg := a.errorStatus(err, group, id)
	return &adminapi.StatusError{Status: status, Message: msg}
}

// writeError answers err: a *adminapi.StatusError with its status and
// message, anything else as an internal error.
func writeError(w http.ResponseWriter, err error) {
	var se *adminapi.StatusError
	if errors.As(err, &se) {
		writeJSON(w, se.Status, adminapi.Error{Error: se.Message})
		return
	}
	writeJSON(w, http.StatusInternalServerError, adminapi.Error{Error: err.Error()})
}
