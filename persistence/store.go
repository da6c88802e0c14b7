package persistence

import (
	"fmt"

	"github.com/keyline-mq/keyline/internal/share"
	"github.com/keyline-mq/keyline/keyshared"
)

// Names of keyshared's storage types and errors, which persistence's group
// stores implement and return (keyshared/groupstore.go has their contract).
type (
	GroupStore      = keyshared.GroupStore
	GroupConfig     = keyshared.GroupConfig
	GroupInfo       = keyshared.GroupInfo
	BacklogPolicy   = keyshared.BacklogPolicy
	AppendResult    = keyshared.AppendResult
	DeadLetterEntry = keyshared.DeadLetterEntry
)

// The errors of keyshared/groupstore.go, by their names here.
var (
	ErrGroupNotFound      = keyshared.ErrGroupNotFound
	ErrBadGroupName       = keyshared.ErrBadGroupName
	ErrBadConfig          = keyshared.ErrBadConfig
	ErrBacklogFull        = keyshared.ErrBacklogFull
	ErrDeadLetterNotFound = keyshared.ErrDeadLetterNotFound
	// ErrClosed is returned by every operation on a store after Close.
	ErrClosed = keyshared.ErrStoreClosed
)

// The backlog policies of keyshared, by their names here.
const (
	PolicyReject     = keyshared.PolicyReject
	PolicyDropOldest = keyshared.PolicyDropOldest
	MaxGroupNameLen  = keyshared.MaxGroupNameLen
)

// splitGroupName validates a group name and returns its share name and filter.
func splitGroupName(name string) (shareName, filter string, err error) {
	n, err := share.Parse(name)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrBadGroupName, err)
	}
	return n.Share, n.Filter, nil
}

func groupNotFound(name string) error { return fmt.Errorf("%w: %q", ErrGroupNotFound, name) }
