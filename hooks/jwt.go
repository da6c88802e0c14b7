package hooks

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
)

// JWTVerifier checks the JSON Web Tokens clients send as their password
// (github.com/golang-jwt/jwt/v5): RS256 or ES256 only, signed by one of its
// keys, with an exp claim that has not passed; the sub (or username) claim
// is the user. A token may carry its own ACL in ACLClaim, an object of
// filter -> access (0 deny, 1 read, 2 write, 3 both), tried before the
// config's rules.
type JWTVerifier struct {
	keys     []crypto.PublicKey
	byKid    map[string]crypto.PublicKey
	ACLClaim string // "": tokens carry no ACL
	Path     string
}

// maxTokenLen bounds a token: a longer password is not parsed as one.
const maxTokenLen = 16 << 10

// LoadJWTKeys reads a PEM file of public keys (RSA or EC P-256) or a JWKS
// file (a JSON {"keys": [...]} of RSA and EC P-256 keys).
func LoadJWTKeys(path, aclClaim string) (*JWTVerifier, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	v := &JWTVerifier{byKid: map[string]crypto.PublicKey{}, ACLClaim: aclClaim, Path: path}
	if strings.HasPrefix(strings.TrimSpace(string(data)), "{") {
		err = v.parseJWKS(data)
	} else {
		err = v.parsePEM(data)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(v.keys) == 0 {
		return nil, fmt.Errorf("%s: no public key in it", path)
	}
	return v, nil
}

func (v *JWTVerifier) parsePEM(data []byte) error {
	for n := 1; ; n++ {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return nil
		}
		var key any
		var err error
		switch b.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(b.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(b.Bytes)
		case "CERTIFICATE":
			var c *x509.Certificate
			if c, err = x509.ParseCertificate(b.Bytes); err == nil {
				key = c.PublicKey
			}
		default:
			continue
		}
		if err != nil {
			return fmt.Errorf("PEM block %d: %w", n, err)
		}
		if err := v.add("", key); err != nil {
			return fmt.Errorf("PEM block %d: %w", n, err)
		}
	}
}

func (v *JWTVerifier) add(kid string, key any) error {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return fmt.Errorf("RSA key of %d bits: want at least 2048", k.N.BitLen())
		}
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return errors.New("EC key not on P-256 (ES256)")
		}
	default:
		return fmt.Errorf("%T: want an RSA (RS256) or EC P-256 (ES256) public key", key)
	}
	v.keys = append(v.keys, key)
	if kid != "" {
		v.byKid[kid] = key
	}
	return nil
}

// parseJWKS reads RFC 7517 key sets: kty RSA (n, e) and EC P-256 (x, y).
func (v *JWTVerifier) parseJWKS(data []byte) error {
	var set struct {
		Keys []struct {
			Kty, Kid, Crv, N, E, X, Y, Use string
		} `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return fmt.Errorf("JWKS: %w", err)
	}
	b64 := func(s string) (*big.Int, error) {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil || len(b) == 0 {
			return nil, fmt.Errorf("bad base64url %q", clip(s))
		}
		return new(big.Int).SetBytes(b), nil
	}
	for i, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		var key any
		switch k.Kty {
		case "RSA":
			n, err := b64(k.N)
			if err != nil {
				return fmt.Errorf("JWKS key %d: n: %w", i+1, err)
			}
			e, err := b64(k.E)
			if err != nil || !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31 {
				return fmt.Errorf("JWKS key %d: bad e", i+1)
			}
			key = &rsa.PublicKey{N: n, E: int(e.Int64())}
		case "EC":
			if k.Crv != "P-256" {
				return fmt.Errorf("JWKS key %d: curve %q, want P-256", i+1, clip(k.Crv))
			}
			x, err := b64(k.X)
			if err != nil {
				return fmt.Errorf("JWKS key %d: x: %w", i+1, err)
			}
			y, err := b64(k.Y)
			if err != nil {
				return fmt.Errorf("JWKS key %d: y: %w", i+1, err)
			}
			pub := &ecdsa.PublicKey{Curve: elliptic.P256(), X: x, Y: y}
			if _, err := pub.ECDH(); err != nil { // rejects a point not on the curve
				return fmt.Errorf("JWKS key %d: %w", i+1, err)
			}
			key = pub
		default:
			continue // a key type JWT-for-MQTT does not use (oct: shared secrets are refused)
		}
		if err := v.add(k.Kid, key); err != nil {
			return fmt.Errorf("JWKS key %d: %w", i+1, err)
		}
	}
	return nil
}

// looksLikeJWT reports whether a password is shaped as a compact JWS.
func looksLikeJWT(p []byte) bool {
	return len(p) > 20 && len(p) <= maxTokenLen && strings.HasPrefix(string(p), "eyJ") && strings.Count(string(p), ".") == 2
}

// verify checks token and returns its user, expiry and ACL filters.
func (v *JWTVerifier) verify(token string, now time.Time) (user string, exp time.Time, acl []aclFilter, err error) {
	keyFunc := func(t *jwt.Token) (any, error) {
		if kid, _ := t.Header["kid"].(string); kid != "" {
			if k, ok := v.byKid[kid]; ok {
				return k, nil
			}
		}
		var ks jwt.VerificationKeySet
		for _, k := range v.keys {
			ks.Keys = append(ks.Keys, k)
		}
		return ks, nil
	}
	claims := jwt.MapClaims{}
	p := jwt.NewParser(jwt.WithValidMethods([]string{"RS256", "ES256"}), jwt.WithExpirationRequired(), jwt.WithTimeFunc(func() time.Time { return now }))
	if _, err = p.ParseWithClaims(token, claims, keyFunc); err != nil {
		return "", time.Time{}, nil, err
	}
	user, _ = claims.GetSubject()
	if u, ok := claims["username"].(string); ok && u != "" {
		user = u
	}
	if user == "" || len(user) > 1024 {
		return "", time.Time{}, nil, errors.New("token has no sub or username claim of at most 1 KiB")
	}
	e, err := claims.GetExpirationTime()
	if err != nil || e == nil {
		return "", time.Time{}, nil, errors.New("token has no exp claim")
	}
	if c, ok := claims[v.ACLClaim]; ok && v.ACLClaim != "" {
		m, ok := c.(map[string]any)
		if !ok || len(m) > 256 {
			return "", time.Time{}, nil, fmt.Errorf("claim %q is not an object of at most 256 filter: access", v.ACLClaim)
		}
		fs := auth.Filters{}
		for f, a := range m {
			n, ok := a.(float64)
			if !ok || n < 0 || n > 3 || n != float64(int(n)) || len(f) > 1024 {
				return "", time.Time{}, nil, fmt.Errorf("claim %q: filter %q: access must be 0 to 3", v.ACLClaim, clip(f))
			}
			fs[auth.RString(f)] = auth.Access(n)
		}
		acl = sortFilters(fs)
	}
	return user, e.Time, acl, nil
}
