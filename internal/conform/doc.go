// Package conform holds the MQTT rules Keyline enforces where mochi (v2.7.9)
// does not, as plain functions of the bytes on the wire, without mochi:
//
//   - Checker follows the frames one client sends as they stream through the
//     connection, before mochi reads them, and finds the protocol errors that
//     mochi's decoder lets through: a property other than User Property that
//     appears twice in one property block of any packet a client sends
//     (mochi keeps the last one), and Receive Maximum or Maximum Packet Size 0
//     in CONNECT. MQTT 5 makes each a Protocol Error: the connection is closed
//     with DISCONNECT 0x82, or CONNACK 0x82 for a CONNECT.
//   - Connack311 maps MQTT 5 CONNACK reason codes to the six return codes
//     MQTT 3.1.1 has.
//
// # Invariants
//
//  1. Inspect never panics and never loses its place in the stream, whatever
//     the bytes: it trusts each frame's fixed header for the frame's length and
//     passes a frame it cannot read (malformed, or over the size limit) to
//     mochi unchecked, which refuses it. A stream whose fixed header is itself
//     malformed, or whose first frame is not a CONNECT, is no longer checked
//     (mochi closes it).
//  2. The verdict does not depend on how the stream is split into reads: the
//     same bytes give the same error at the same frame, or none.
//  3. No byte of a frame with a protocol error is passed in the read that
//     finds the error, and that read passes every byte before the frame: mochi
//     handles every frame before the bad one and never sees the bad one whole.
//  4. A frame's bytes are looked at in place; only the head of a frame (fixed
//     header through its property blocks) that arrives over several reads is
//     copied, and only for frames within the size limit, so what a Checker
//     holds is bounded by the limit. Payloads are never copied.
//  5. After a CONNECT for MQTT 3.1.1 or 3.1 (no properties), Inspect passes
//     every byte at once.
//
// # Caveats
//
// The Checker checks only what mochi gets wrong: malformed property blocks,
// properties a packet may not carry and other MQTT rules are mochi's to
// enforce, and frames over the size limit are mochi's to refuse.
package conform
