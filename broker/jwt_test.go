package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/golang-jwt/jwt/v5"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/poll"
)

// TestJWTAuthentication: a token signed by a configured key (a PEM EC key,
// or an RSA key of a JWKS file) connects as its sub claim, under the ACL it
// carries, until it expires; forged, expired, HS256 and mismatched tokens
// are refused.
func TestJWTAuthentication(t *testing.T) {
	dir := t.TempDir()
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := json.Marshal(map[string]any{"keys": []map[string]string{{"kty": "RSA", "kid": "r1", "use": "sig",
		"n": base64.RawURLEncoding.EncodeToString(rsaKey.N.Bytes()),
		"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(rsaKey.E)).Bytes())}}})
	if err != nil {
		t.Fatal(err)
	}
	pemFile, jwksFile := filepath.Join(dir, "jwt.pem"), filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(pemFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(jwksFile, jwks, 0o600); err != nil {
		t.Fatal(err)
	}
	sign := func(method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
		t.Helper()
		tok := jwt.NewWithClaims(method, claims)
		if method == jwt.SigningMethodRS256 {
			tok.Header["kid"] = "r1"
		}
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	hour := time.Now().Add(time.Hour).Unix()
	acl := map[string]any{"devices/d1/#": 3, "#": 0}

	for _, keyFile := range []string{pemFile, jwksFile} {
		t.Run(filepath.Base(keyFile), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.JWTKey, cfg.JWTACLClaim = keyFile, "acl"
			b := startBroker(t, cfg)
			try := func(id, user, token string) (*mqtttest.V5, error) {
				return mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, b.Addr("tcp"), nil), &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30,
					Username: user, UsernameFlag: user != "", Password: []byte(token), PasswordFlag: true})
			}
			method, key := any(jwt.SigningMethodES256), any(ecKey)
			if keyFile == jwksFile {
				method, key = jwt.SigningMethodRS256, rsaKey
			}
			good := func(claims jwt.MapClaims) string { return sign(method.(jwt.SigningMethod), key, claims) }
			otherEC, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			for name, token := range map[string]string{
				"expired":        good(jwt.MapClaims{"sub": "d1", "exp": time.Now().Add(-time.Minute).Unix()}),
				"without exp":    good(jwt.MapClaims{"sub": "d1"}),
				"forged":         sign(jwt.SigningMethodES256, otherEC, jwt.MapClaims{"sub": "d1", "exp": hour}),
				"HS256":          sign(jwt.SigningMethodHS256, []byte("secret"), jwt.MapClaims{"sub": "d1", "exp": hour}),
				"without sub":    good(jwt.MapClaims{"exp": hour}),
				"bad acl claim":  good(jwt.MapClaims{"sub": "d1", "exp": hour, "acl": map[string]any{"#": 9}}),
				"other username": good(jwt.MapClaims{"sub": "d2", "exp": hour}),
			} {
				user := ""
				if name == "other username" {
					user = "d1"
				}
				if c, err := try("bad", user, token); err == nil {
					c.Close()
					t.Errorf("a token %s connected", name)
				}
			}

			c, err := try("d1", "", good(jwt.MapClaims{"sub": "d1", "exp": hour, "acl": acl}))
			if err != nil {
				t.Fatalf("a valid token: %v", err)
			}
			defer c.Close()
			if rc := c.Publish(t, &paho.Publish{Topic: "devices/d1/t", QoS: 1, Payload: []byte("1")}); rc != 0 {
				t.Errorf("publish allowed by the token's ACL: %#x", rc)
			}
			if rc := c.Publish(t, &paho.Publish{Topic: "devices/d2/t", QoS: 1, Payload: []byte("1")}); rc != 0x87 {
				t.Errorf("publish the token's ACL denies: %#x, want 0x87", rc)
			}
			if cl, ok := b.Server().Clients.Get("d1"); !ok || string(cl.Properties.Username) != "d1" {
				t.Error("the client's user name is not the token's sub")
			}

			// The token's ACL holds for deliveries too (the fan-out's read
			// check): a subscription its ACL allows does not bring what it denies.
			watcher, err := try("w1", "", good(jwt.MapClaims{"sub": "w1", "exp": hour,
				"acl": map[string]any{"devices/+/status": 1, "devices/d2/status": 0}}))
			if err != nil {
				t.Fatalf("the watcher's token: %v", err)
			}
			defer watcher.Close()
			if rc := watcher.Subscribe(t, paho.SubscribeOptions{Topic: "devices/+/status", QoS: 1}); rc[0] != 1 {
				t.Fatalf("subscribe the token's ACL allows: %#x", rc[0])
			}
			pub, err := try("p1", "", good(jwt.MapClaims{"sub": "p1", "exp": hour}))
			if err != nil {
				t.Fatalf("the publisher's token: %v", err)
			}
			defer pub.Close()
			pub.Publish(t, &paho.Publish{Topic: "devices/d2/status", QoS: 1, Payload: []byte("d2")})
			pub.Publish(t, &paho.Publish{Topic: "devices/d1/status", QoS: 1, Payload: []byte("d1")})
			if m := watcher.Next(t); m.Topic != "devices/d1/status" {
				t.Errorf("the watcher got %s first, want devices/d1/status (its token denies devices/d2/status)", m.Topic)
			}

			// A token that expires in a second or two: the client is cut off
			// then. A deliberate wall-clock wait: exp has a resolution of a
			// second, and the broker's timer runs on the wall clock.
			short, err := try("d1-short", "", good(jwt.MapClaims{"sub": "d1", "exp": time.Now().Add(2 * time.Second).Unix()}))
			if err != nil {
				t.Fatalf("a short-lived token: %v", err)
			}
			select {
			case <-short.Done():
			case <-time.After(mqtttest.Timeout):
				t.Fatal("still connected after the token expired")
			}
			poll.Until(t, mqtttest.Timeout, "the expiry is counted", func() bool { return b.auth.TokensExpired.Load() == 1 })
			if rc := c.Publish(t, &paho.Publish{Topic: "devices/d1/t", QoS: 1, Payload: []byte("2")}); rc != 0 {
				t.Errorf("the long-lived client after the other's expiry: %#x", rc)
			}
		})
	}
}
