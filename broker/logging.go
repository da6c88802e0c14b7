package broker

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/keyline-mq/keyline/internal/enum"
)

// LogLevel is the log-level setting. The zero value means "not set".
type LogLevel uint8

// The log levels, least severe first.
const (
	LogDebug LogLevel = iota + 1
	LogInfo
	LogWarn
	LogError
)

// LogLevels names the levels, in value order.
var LogLevels = enum.Names{"debug", "info", "warn", "error"}

func (l LogLevel) String() string { return LogLevels.Name(uint8(l)) }

// Level returns the slog level.
func (l LogLevel) Level() slog.Level {
	return [...]slog.Level{slog.LevelInfo, slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError}[min(int(l), 4)]
}

// UnmarshalText parses the level from YAML and other text formats.
func (l *LogLevel) UnmarshalText(b []byte) error {
	v, err := LogLevels.Parse("log-level", string(b), ErrInvalidConfig)
	if err == nil {
		*l = LogLevel(v)
	}
	return err
}

// MarshalText prints the level's name.
func (l LogLevel) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// Set makes *LogLevel a flag value (pflag.Value).
func (l *LogLevel) Set(s string) error { return l.UnmarshalText([]byte(s)) }

// Type names the flag's value type in --help.
func (l *LogLevel) Type() string { return "level" }

// LogFormat is the log-format setting. The zero value means "not set".
type LogFormat uint8

// The log formats.
const (
	LogText LogFormat = iota + 1
	LogJSON
)

// LogFormats names the formats, in value order.
var LogFormats = enum.Names{"text", "json"}

func (f LogFormat) String() string { return LogFormats.Name(uint8(f)) }

// UnmarshalText parses the format from YAML and other text formats.
func (f *LogFormat) UnmarshalText(b []byte) error {
	v, err := LogFormats.Parse("log-format", string(b), ErrInvalidConfig)
	if err == nil {
		*f = LogFormat(v)
	}
	return err
}

// MarshalText prints the format's name.
func (f LogFormat) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// Set makes *LogFormat a flag value (pflag.Value).
func (f *LogFormat) Set(s string) error { return f.UnmarshalText([]byte(s)) }

// Type names the flag's value type in --help.
func (f *LogFormat) Type() string { return "format" }

// NewLogger returns a slog logger writing to w at level in format.
func NewLogger(w io.Writer, level LogLevel, format LogFormat) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level.Level()}
	switch format {
	case LogText:
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case LogJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%w: log-format is not one of %s", ErrInvalidConfig, LogFormats)
}

// SessionOwnership is the session-ownership setting. The zero value means "not set".
type SessionOwnership uint8

// The session ownership policies.
const (
	// OwnershipRefuse refuses a CONNECT with another user's client id (MQTT 5 0x87, 3.1.1 0x05).
	OwnershipRefuse SessionOwnership = iota + 1
	// OwnershipFresh discards the other user's session and starts a fresh one.
	OwnershipFresh
)

// SessionOwnerships names the policies, in value order.
var SessionOwnerships = enum.Names{"refuse", "fresh"}

func (o SessionOwnership) String() string { return SessionOwnerships.Name(uint8(o)) }

// UnmarshalText parses the policy from YAML and other text formats.
func (o *SessionOwnership) UnmarshalText(b []byte) error {
	v, err := SessionOwnerships.Parse("session-ownership", string(b), ErrInvalidConfig)
	if err == nil {
		*o = SessionOwnership(v)
	}
	return err
}

// MarshalText prints the policy's name.
func (o SessionOwnership) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// Set makes *SessionOwnership a flag value (pflag.Value).
func (o *SessionOwnership) Set(s string) error { return o.UnmarshalText([]byte(s)) }

// Type names the flag's value type in --help.
func (o *SessionOwnership) Type() string { return "policy" }
