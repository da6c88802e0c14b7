package adminapi

import (
	"net/http"
	"testing"
)

func TestConsoleRoutes(t *testing.T) {
	if r := ClientDisconnect("a b/c"); r.Method != http.MethodPost || r.Path != "/api/v1/clients/a%20b%2Fc/disconnect" {
		t.Errorf("ClientDisconnect = %+v", r)
	}
	if r := GroupMessages("g/t/#", 5); r.Query.Get("group") != "g/t/#" || r.Query.Get("limit") != "5" || r.Path != PathGroupMessages {
		t.Errorf("GroupMessages = %+v", r)
	}
}
