package bridge

import (
	"fmt"
)

// reasonName names an MQTT 5 reason code as the specification does.
func reasonName(code byte) string {
	if n, ok := reasonNames[code]; ok {
		return fmt.Sprintf("0x%02x %s", code, n)
	}
	return fmt.Sprintf("0x%02x", code)
}

var reasonNames = map[byte]string{
	0x00: "success", 0x10: "no matching subscribers", 0x80: "unspecified error",
	0x81: "malformed packet", 0x82: "protocol error", 0x83: "implementation specific error",
	0x84: "unsupported protocol version", 0x85: "client identifier not valid", 0x86: "bad user name or password",
	0x87: "not authorized", 0x88: "server unavailable", 0x89: "server busy", 0x8A: "banned",
	0x8B: "server shutting down", 0x8C: "bad authentication method", 0x8D: "keep alive timeout",
	0x8E: "session taken over", 0x90: "topic name invalid", 0x91: "packet identifier in use",
	0x92: "packet identifier not found", 0x93: "receive maximum exceeded", 0x95: "packet too large",
	0x97: "quota exceeded", 0x99: "payload format invalid", 0x9A: "retain not supported",
	0x9B: "QoS not supported", 0x9C: "use another server", 0x9D: "server moved",
	0x9F: "connection rate exceeded",
}

// permanent reports whether a remote's refusal of a publish cannot succeed
// if tried again: the message is dead-lettered at once.
func permanent(code byte) bool {
	switch code {
	case 0x87, 0x90, 0x95, 0x99, 0x9A, 0x9B:
		return true
	}
	return false
}
