// Package mqttwire is Keyline's one hand-written MQTT 3.1.1 / 5 codec, for the
// tools and tests that speak MQTT without a client library: the load
// generator (integration/loadgen) and the raw test client
// (internal/mqtttest). The broker itself decodes with mochi; its one use of
// this package is internal/conform, which reads the fixed headers and walks
// the property blocks of what clients send (ReadVarint, RawProperties.Skip)
// on every connection's read path: keep those small.
//
// # Basics
//
// A frame is a fixed header (packet type, flags, remaining length) and a body.
// Reader reads frames from a connection; ParseHeader finds one at the front of
// a byte slice. The Append functions encode the packets a client sends
// (CONNECT, SUBSCRIBE, UNSUBSCRIBE, PUBLISH, the PUBACK family, DISCONNECT,
// PINGREQ) onto a caller's slice, growing it once; the Decode functions take
// a Packet and decode the packets a broker sends (CONNACK, PUBLISH, SUBACK,
// UNSUBACK, the PUBACK family, DISCONNECT). Every function that depends on
// the protocol takes the version: Version311 (4) or Version5.
//
// MQTT 5 properties come in two forms. RawProperties is a property block as
// it stands in a frame; its Next, UserValue and Validate read it in place
// without allocating. Properties is the decoded form, with the properties the
// tools use as fields (Parse skips the others after checking their size).
//
// # Invariants
//
//  1. No Decode function, Parse, ParseHeader or Reader.Next panics, whatever
//     the bytes: a frame that is not well formed is an error wrapping
//     ErrMalformed (or ErrIncomplete, from ParseHeader, while a header is
//     still arriving).
//  2. What a Decode function returns aliases the packet's body: Topic,
//     Payload, ReasonCodes and RawProperties are valid as long as the body is
//     (for a Reader, until its next call to Next). Copy what you keep.
//  3. A decoded packet's RawProperties are well formed (the decoder walked
//     them), so reading them again does not fail.
//  4. Round trips hold: decoding what an Append function wrote gives back its
//     fields, and Parse after AppendProperties gives back the Properties (with
//     the presence flags set for what was sent, and empty values not sent).
//
// # Caveats
//
// The package checks structure, not semantics: it does not validate UTF-8,
// topic names, reason codes or which properties a packet may carry. Strings
// and binary data longer than 65,535 bytes and remaining lengths over
// MaxRemaining cannot be encoded; the Append functions panic on them, as a
// frame with a wrong length would only fail later and further away.
package mqttwire
