package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
)

// Subjects. Everything Keyline puts on NATS lives under Prefix, so no MQTT
// topic can reach $JS, $KV, $SYS or another application's subjects:
//
//	kl.m.<class>.<levels>   QoS 0 messages, core NATS (one copy per interested node)
//	kl.q.<class>.<levels>   QoS 1/2 messages, stream KL_MSGS
//	kl.r.<class>.<levels>   retained messages, stream KL_RETAINED (one per subject)
//
// <class> is "t" for an ordinary topic, "s" for a topic whose first level
// starts with '$' (so that the filters '#' and '+/...' never match them on
// NATS either, [MQTT-4.7.2-1]) and "h" for a topic whose subject would be
// longer than MaxSubjectLen: its subject is kl.<kind>.h.<hash> and the topic
// travels in the message.
//
// <levels> is one NATS token per MQTT topic level: the bytes A-Z a-z 0-9 '-'
// '_' stand for themselves, every other byte is '~' and two upper-case hex
// digits, and an empty level is the token "~". The encoding is injective, so
// DecodeSubject inverts it, and its tokens never hold '.', '*', '>' or
// whitespace.
const (
	Prefix = "kl"

	KindMessage  = "m" // core NATS fan-out
	KindQueued   = "q" // stream KL_MSGS
	KindRetained = "r" // stream KL_RETAINED

	classTopic  = "t"
	classSys    = "s"
	classHashed = "h"

	// MaxSubjectLen caps a subject Keyline publishes or subscribes to. NATS
	// closes a client connection whose control line passes max_control_line
	// (4 KiB by default); the subject shares that line with a reply subject
	// and sizes.
	MaxSubjectLen = 1024

	// unreachableLevel is a token the encoding never produces ('~' followed
	// by a non-hex byte): a filter built on it matches nothing.
	unreachableLevel = "~~"
)

// ErrInvalidTopic is returned for a topic or filter MQTT itself forbids.
var ErrInvalidTopic = errors.New("cluster: invalid topic or filter")

func isPlain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

const hexDigits = "0123456789ABCDEF"

// appendLevel appends the token of one MQTT topic level.
func appendLevel(b []byte, level string) []byte {
	if level == "" {
		return append(b, '~')
	}
	for i := 0; i < len(level); i++ {
		c := level[i]
		if isPlain(c) {
			b = append(b, c)
			continue
		}
		b = append(b, '~', hexDigits[c>>4], hexDigits[c&15])
	}
	return b
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// decodeLevel inverts appendLevel.
func decodeLevel(tok string) (string, bool) {
	if tok == "~" {
		return "", true
	}
	if tok == "" {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if isPlain(c) {
			b.WriteByte(c)
			continue
		}
		if c != '~' || i+2 >= len(tok) {
			return "", false
		}
		hi, ok1 := unhex(tok[i+1])
		lo, ok2 := unhex(tok[i+2])
		if !ok1 || !ok2 {
			return "", false
		}
		v := hi<<4 | lo
		if isPlain(v) {
			return "", false // not canonical: the encoder writes it plain
		}
		b.WriteByte(v)
		i += 2
	}
	return b.String(), true
}

func classOf(topic string) string {
	if strings.HasPrefix(topic, "$") {
		return classSys
	}
	return classTopic
}

// TopicHash is the token that routes a topic too long for a subject.
func TopicHash(topic string) string {
	sum := sha256.Sum256([]byte(topic))
	return hex.EncodeToString(sum[:16])
}

// TopicSubject returns the subject of an MQTT topic name (no wildcards) for
// one kind of subject, and whether it is hashed (the topic is too long to be
// spelled out, so the receiver must take it from the message).
func TopicSubject(kind, topic string) (subject string, hashed bool) {
	b := make([]byte, 0, len(Prefix)+len(topic)+8)
	b = append(b, Prefix...)
	b = append(b, '.')
	b = append(b, kind...)
	b = append(b, '.')
	head := len(b)
	b = append(b, classOf(topic)...)
	rest := topic
	for {
		level, tail, more := strings.Cut(rest, "/")
		b = append(b, '.')
		b = appendLevel(b, level)
		if len(b) > MaxSubjectLen {
			return string(append(b[:head], classHashed+"."+TopicHash(topic)...)), true
		}
		if !more {
			break
		}
		rest = tail
	}
	return string(b), false
}

// DecodeSubject inverts TopicSubject for subjects that are not hashed: it
// returns the kind and the topic.
func DecodeSubject(subject string) (kind, topic string, ok bool) {
	toks := strings.Split(subject, ".")
	if len(toks) < 4 || toks[0] != Prefix {
		return "", "", false
	}
	kind, class := toks[1], toks[2]
	if class != classTopic && class != classSys {
		return "", "", false
	}
	levels := make([]string, len(toks)-3)
	for i, t := range toks[3:] {
		l, ok := decodeLevel(t)
		if !ok {
			return "", "", false
		}
		levels[i] = l
	}
	topic = strings.Join(levels, "/")
	if classOf(topic) != class {
		return "", "", false
	}
	return kind, topic, true
}

// FilterSubjects returns the subjects a node subscribes to (for one kind of
// subject) to receive every message that MQTT filter f matches. The set may
// match more than f (the receiver matches each message against its own
// subscriptions): a filter with a wildcard also takes every hashed (long)
// topic, and one whose literal part is too long takes all topics of its class.
//
//	a/b   -> kl.k.t.a.b             (or kl.k.h.<hash> when too long)
//	a/+/c -> kl.k.t.a.*.c, kl.k.h.*
//	a/#   -> kl.k.t.a, kl.k.t.a.>, kl.k.h.*
//	#     -> kl.k.t.>, kl.k.h.*     ('$' topics are class s: not matched)
//	$x/#  -> kl.k.s.$x..., kl.k.h.*
//
// f must be a valid MQTT filter without a $share prefix.
func FilterSubjects(kind, f string) ([]string, error) {
	if f == "" {
		return nil, ErrInvalidTopic
	}
	levels := strings.Split(f, "/")
	wild := false
	for i, l := range levels {
		switch {
		case l == "#":
			if i != len(levels)-1 {
				return nil, ErrInvalidTopic
			}
			wild = true
		case l == "+":
			wild = true
		case strings.ContainsAny(l, "+#"):
			return nil, ErrInvalidTopic
		}
	}
	if !wild {
		s, _ := TopicSubject(kind, f)
		return []string{s}, nil
	}
	base := Prefix + "." + kind + "."
	hashed := base + classHashed + ".*"
	class := classTopic
	if strings.HasPrefix(levels[0], "$") {
		class = classSys
	}
	b := []byte(base + class)
	var out []string
	for i, l := range levels {
		switch l {
		case "#":
			if i > 0 {
				out = append(out, string(b)) // a/# matches a too
			}
			b = append(b, ".>"...)
		case "+":
			b = append(b, ".*"...)
		default:
			b = append(b, '.')
			b = appendLevel(b, l)
		}
		if len(b) > MaxSubjectLen {
			// Too long to spell out: take the whole class and let the
			// receiver match. Rare (a filter of about a kilobyte).
			return []string{base + class + ".>", hashed}, nil
		}
	}
	return append(out, string(b), hashed), nil
}

// ValidSubject reports whether s is a subject NATS accepts for publishing
// (wildcards false) or subscribing (wildcards true): non-empty tokens without
// whitespace, '*' and '>' only as whole tokens and only when subscribing,
// '>' last.
func ValidSubject(s string, wildcards bool) bool {
	if s == "" || len(s) > MaxSubjectLen {
		return false
	}
	toks := strings.Split(s, ".")
	for i, t := range toks {
		if t == "" || strings.ContainsAny(t, " \t\r\n\f\v") {
			return false
		}
		if t == "*" || t == ">" {
			if !wildcards || (t == ">" && i != len(toks)-1) {
				return false
			}
			continue
		}
		if strings.ContainsAny(t, "*>") {
			return false
		}
	}
	return true
}
