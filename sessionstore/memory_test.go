package sessionstore_test

import (
	"testing"

	"github.com/keyline-mq/keyline/sessionstore"
	"github.com/keyline-mq/keyline/sessionstore/storetest"
)

// TestMemory runs the contract suite against the in-memory store (one
// node: the suite's two stores are the same).
func TestMemory(t *testing.T) {
	storetest.Run(t, func(*testing.T) []sessionstore.Store {
		m := sessionstore.NewMemory()
		return []sessionstore.Store{m, m}
	})
}
