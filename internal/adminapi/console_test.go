package adminapi

import (
	"net/http"
	"strings"
	"testing"
)

func TestSessionValue(t *testing.T) {
	a, b := SessionValue("s3cret"), SessionValue("s3cret2")
	if a != SessionValue("s3cret") || a == b || strings.Contains(a, "s3cret") {
		t.Errorf("SessionValue: %q, %q", a, b)
	}
	// The value must survive a cookie unchanged.
	c := (&http.Cookie{Name: SessionCookie, Value: a}).String()
	if c != SessionCookie+"="+a {
		t.Errorf("cookie %q", c)
	}
}

func TestConsoleRoutes(t *testing.T) {
	if r := ClientDisconnect("a b/c"); r.Method != http.MethodPost || r.Path != "/api/v1/clients/a%20b%2Fc/disconnect" {
		t.Errorf("ClientDisconnect = %+v", r)
	}
	if r := GroupMessages("g/t/#", 5); r.Query.Get("group") != "g/t/#" || r.Query.Get("limit") != "5" || r.Path != PathGroupMessages {
		t.Errorf("GroupMessages = %+v", r)
	}
}
