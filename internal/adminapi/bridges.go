package adminapi

import (
	"net/http"
	"net/url"
	"time"
)

// PathBridges lists the broker's bridges (GET); PathBridges/{name} shows one.
const PathBridges = "/api/v1/bridges"

// BridgeList answers GET PathBridges.
type BridgeList struct {
	Bridges []BridgeView `json:"bridges"`
}

// BridgeView is what the admin API shows of one bridge to a remote broker.
// Counters count since the broker started.
type BridgeView struct {
	Name string `json:"name"`
	// State is connected, connecting, disconnected, standby (cluster mode:
	// another node runs the bridge) or stopped.
	State       string     `json:"state"`
	Address     string     `json:"address,omitempty"` // the remote address connected to
	ConnectedAt *time.Time `json:"connected_at,omitempty"`
	// Subscribed: the remote answered the inbound rules' SUBSCRIBE.
	Subscribed bool     `json:"subscribed"`
	Addresses  []string `json:"addresses"` // configured, tried in order
	ClientID   string   `json:"client_id"`
	Protocol   string   `json:"protocol"`       // 3.1.1 or 5
	Node       string   `json:"node,omitempty"` // cluster mode: the node holding the bridge's lease
	Topics     []string `json:"topics"`         // the rules, as mosquitto topic lines
	Groups     []string `json:"groups"`         // the outbound rules' internal groups

	QueuedMessages uint64 `json:"queued_messages"` // outbound messages waiting for the remote
	QueuedBytes    uint64 `json:"queued_bytes"`    // bytes their logs hold (acknowledged ones not yet trimmed included)
	InFlight       int    `json:"in_flight"`       // publishes awaiting the remote's acknowledgement
	Sent           uint64 `json:"sent"`            // acknowledged by the remote (or sent at QoS 0)
	Received       uint64 `json:"received"`        // brought in from the remote and published here
	// Dropped: looped back, QoS 0 without a connection, dropped or refused
	// by the backlog limit, from the remote without a matching rule.
	Dropped     uint64     `json:"dropped"`
	Looped      uint64     `json:"looped"`       // of Dropped: messages that had left this broker already
	Nacked      uint64     `json:"nacked"`       // the remote's refusals (retried, or dead-lettered)
	Refused     uint64     `json:"refused"`      // messages from the remote refused here for now (sent again)
	DeadLetters uint64     `json:"dead_letters"` // refused by the remote for good, kept in the groups' dead letters
	Connects    uint64     `json:"connects"`
	Failures    uint64     `json:"failures"` // connection attempts that failed
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
}

// ListBridges is GET PathBridges.
func ListBridges() Route[BridgeList] { return Route[BridgeList]{http.MethodGet, PathBridges, nil} }

// Bridge is GET PathBridges/{name}.
func Bridge(name string) Route[BridgeView] {
	return Route[BridgeView]{http.MethodGet, PathBridges + "/" + url.PathEscape(name), nil}
}
