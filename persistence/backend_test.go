package persistence

import (
	"testing"

	"github.com/keyline-mq/keyline/keyshared"
	"github.com/keyline-mq/keyline/keyshared/backendtest"
)

// TestBackend runs the contract suite of keyshared.Backend against the
// local backend over every store of the store suite (the cluster's groups
// run the same suite in package cluster).
func TestBackend(t *testing.T) {
	for _, impl := range storeImpls {
		t.Run(impl.name, func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T) []keyshared.Backend {
				return []keyshared.Backend{keyshared.NewLocalBackend(impl.open(t).s)}
			})
		})
	}
}
