// Package examples holds runnable programs and a config sample for Keyline:
//
//   - keyed-worker: an MQTT 5 member of a Key-Shared group that acks, nacks
//     and rejects, and checks per-key order;
//   - device-fleet: MQTT 3.1.1 devices publishing sequenced telemetry, the
//     topic being the key;
//   - keyline.yaml: a commented configuration file.
//
// README.md walks through them with mosquitto_sub watching a group and its
// dead letters. This package itself only tests that the sample config loads.
package examples
