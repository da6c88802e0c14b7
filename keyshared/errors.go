package keyshared

import "errors"

// ErrClosed is returned by a Dispatcher's methods after Close.
var ErrClosed = errors.New("keyshared: dispatcher closed")

// ErrUnknownMember is returned when a call names a member the group does not
// have (never added, removed, or evicted after being inactive too long).
var ErrUnknownMember = errors.New("keyshared: unknown member")

// ErrInvalidMember is returned by AddMember for an empty member id.
var ErrInvalidMember = errors.New("keyshared: invalid member id")

// ErrInvalidFilter is returned for a key filter pattern that cannot be used
// (empty, too long, not UTF-8, too many patterns). The wrapping error names
// the pattern.
var ErrInvalidFilter = errors.New("keyshared: invalid key filter")

// ErrInvalidConfig is returned by Config.Validate and New for a configuration
// that cannot work. The wrapping error names the field.
var ErrInvalidConfig = errors.New("keyshared: invalid config")

// ErrInvalidPoisonPolicy is returned by ParsePoisonPolicy for an unknown name.
var ErrInvalidPoisonPolicy = errors.New("keyshared: invalid poison policy")
