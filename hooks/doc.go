// Package hooks holds Keyline's thin mochi glue, one hook per concern:
//   - Auth (auth.go, acl.go): authentication, a deterministic ACL, reserved
//     topics, client id ownership;
//   - KeyShared (keyshared.go and ks_*.go): Key-Shared dispatch of $share
//     groups over the durable group logs;
//   - Storage (storage.go): persistent sessions and retained messages in the
//     data file;
//   - Fanout (fanout.go): QoS 0 deliveries encoded once and queued by
//     reference on each connection;
//   - Protocol (protocol.go): CONNACK, SUBACK and UNSUBACK as MQTT wants
//     them where mochi writes them otherwise.
//
// Logic that is not about mochi lives in persistence/ and keyshared/.
package hooks
