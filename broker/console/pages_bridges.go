package console

import (
	"net/http"
	"net/url"

	"github.com/keyline-mq/keyline/internal/adminapi"
)

// The Bridges page: every bridge to a remote broker, its state and figures,
// kept live by polling its admin API view.

type bridgeRow struct {
	adminapi.BridgeView
	StateClass string
	Poll       string
}

type bridgesData struct {
	Bridges []bridgeRow
}

// bridgeClass is the CSS class of a bridge's state.
func bridgeClass(state string) string {
	switch state {
	case "connected":
		return "ok"
	case "standby", "stopped":
		return "muted"
	case "connecting":
		return "warn"
	}
	return "bad"
}

func (c *Console) bridges(_ http.ResponseWriter, _ *http.Request) (*view, error) {
	var d bridgesData
	for _, v := range c.be.Bridges() {
		d.Bridges = append(d.Bridges, bridgeRow{BridgeView: v, StateClass: bridgeClass(v.State), Poll: adminapi.PathBridges + "/" + url.PathEscape(v.Name)})
	}
	return &view{Template: "bridges", Title: "Bridges", Nav: "bridges", Data: d}, nil
}
