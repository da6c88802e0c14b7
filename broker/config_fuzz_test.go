package broker

import (
	"errors"
	"os"
	"reflect"
	"testing"
)

// FuzzDecodeConfig: whatever a config file holds, DecodeConfig and Validate
// return (no panic, no hang), every error is an ErrInvalidConfig, and
// decoding is deterministic.
func FuzzDecodeConfig(f *testing.F) {
	for _, path := range []string{"../examples/keyline.yaml", "../integration/conformance/keyline.yaml"} {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"tcp: 127.0.0.1:1884\nfsync: false\nack-timeout: 45s\n",
		"segment-size: 16MiB\nconn-queue-soft: 512KiB\nmax-key-size: 1KiB\n",
		"retry-backoff: [1s, 1m]\npoison-policy: block\nbacklog-policy: drop-oldest\n",
		"group-overrides:\n  - group: w/orders/#\n    max-deliveries: 3\n  - share: w\n    ack-timeout: 10s\n",
		"conn-queue-overrides:\n  - listener: tcp\n    client-prefix: dash-\n    slow-policy: conflate\n",
		"auth:\n  auth:\n    - username: u\n      password: p\n      allow: true\n  acl:\n    - filters:\n        \"a/#\": 1\n",
		"a: &x [*x, *x]\nb: *x\n",
		"log-level: loud\nslow-policy: shrug\n",
		"nats: nats://127.0.0.1:4222\nnode-id: n1\nnats-replicas: 3\n",
		"- tcp\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := DefaultConfig()
		err := DecodeConfig(data, &c)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("DecodeConfig error %v is not an ErrInvalidConfig", err)
			}
			return
		}
		again := DefaultConfig()
		if err := DecodeConfig(data, &again); err != nil || !reflect.DeepEqual(c, again) {
			t.Fatalf("decoding the same file twice differs: %v", err)
		}
		if err := c.Validate(); err != nil && !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("Validate error %v is not an ErrInvalidConfig", err)
		}
	})
}
