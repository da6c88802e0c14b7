package conform

// MQTT 3.1.1 CONNACK return codes; a 3.1.1 CONNACK carries no other.
const (
	Return311Accepted           byte = 0x00
	Return311BadProtocolVersion byte = 0x01 // unacceptable protocol version
	Return311IdentifierRejected byte = 0x02
	Return311ServerUnavailable  byte = 0x03
	Return311BadCredentials     byte = 0x04 // bad user name or password
	Return311NotAuthorized      byte = 0x05
)

// Connack311 returns the MQTT 3.1.1 return code for an MQTT 5 CONNACK
// reason code, and whether a CONNACK is sent at all: a CONNECT that is
// malformed (0x81) or breaks the protocol (0x82) is answered by closing the
// connection without a CONNACK [MQTT-3.1.4-1]. Codes 0 to 5 are taken as
// 3.1.1 return codes already; a refusal 3.1.1 has no code for is "server
// unavailable", the code that blames neither the client nor its credentials.
func Connack311(code byte) (rc byte, send bool) {
	switch code {
	case 0x81, 0x82: // malformed packet, protocol error
		return 0, false
	case 0x84: // unsupported protocol version
		return Return311BadProtocolVersion, true
	case 0x85: // client identifier not valid
		return Return311IdentifierRejected, true
	case 0x86, 0x8C: // bad user name or password, bad authentication method
		return Return311BadCredentials, true
	case 0x87, 0x8A: // not authorized, banned
		return Return311NotAuthorized, true
	}
	if code <= Return311NotAuthorized {
		return code, true
	}
	return Return311ServerUnavailable, true
}
