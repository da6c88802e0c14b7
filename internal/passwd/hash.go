// Package passwd reads and writes password hashes and password files.
//
// A hash is one of:
//   - argon2id, as a PHC string: $argon2id$v=19$m=<KiB>,t=<passes>,p=<lanes>$<salt>$<key>
//     (unpadded standard base64), what `keyline passwd` writes by default;
//   - bcrypt: $2a$, $2b$ or $2y$ and a cost;
//   - mosquitto's PBKDF2-SHA512, $7$<iterations>$<salt>$<key> (padded
//     standard base64), what mosquitto_passwd 2.x writes;
//   - mosquitto 1.x's salted SHA-512, $6$<salt>$<key>;
//   - plain text: anything that does not start with '$'. It still works, and
//     Plain reports it so that the caller can warn.
//
// A value that starts with '$' is a hash or an error, never plain text, so a
// damaged hash is reported rather than taken as a password.
//
// Caveats: Verify compares in constant time for a given hash, but the schemes
// differ in cost (argon2id and bcrypt take milliseconds, mosquitto's PBKDF2
// with its default 101 iterations well under one); Dummy gives a hash of the
// same scheme and parameters, so that an unknown user can cost what a known
// one does. Parameters are bounded (MaxArgon2Memory and friends): a hash in a
// file must not make every CONNECT allocate gigabytes.
package passwd

import (
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"
)

// Scheme names a kind of password hash.
type Scheme uint8

// The schemes Parse reads.
const (
	Plain        Scheme = iota // not hashed
	Argon2id                   // $argon2id$
	Bcrypt                     // $2a$, $2b$, $2y$
	PBKDF2SHA512               // mosquitto's $7$
	SHA512                     // mosquitto 1.x's $6$
)

func (s Scheme) String() string {
	switch s {
	case Argon2id:
		return "argon2id"
	case Bcrypt:
		return "bcrypt"
	case PBKDF2SHA512:
		return "pbkdf2-sha512"
	case SHA512:
		return "sha512"
	}
	return "plain"
}

// Bounds on the parameters of a hash Parse accepts.
const (
	MaxArgon2Memory  = 256 << 10 // KiB (256 MiB)
	MaxArgon2Passes  = 64
	MaxArgon2Lanes   = 64
	MaxBcryptCost    = 20
	MaxPBKDF2Rounds  = 10_000_000
	minKeyLen        = 16
	maxKeyLen        = 128
	maxSaltLen       = 128
	mosquittoSaltLen = 12
)

// Default argon2id parameters of New: OWASP's second recommended set (7 MiB,
// 5 passes, 1 lane), as strong as its 46 MiB one for far less memory per
// CONNECT being verified.
const (
	DefaultArgon2Memory = 7 << 10
	DefaultArgon2Passes = 5
	argon2KeyLen        = 32
	argon2SaltLen       = 16
)

// DefaultBcryptCost is the cost New uses for bcrypt.
const DefaultBcryptCost = bcrypt.DefaultCost

// ErrInvalidHash wraps every error of Parse.
var ErrInvalidHash = errors.New("passwd: invalid password hash")

// Hash is a parsed password hash. The zero Hash matches nothing.
type Hash struct {
	scheme Scheme
	// encoded is the hash as written (bcrypt's whole string; for plain
	// text, the SHA-256 of the password, so that comparing it is constant time).
	encoded []byte
	salt    []byte
	key     []byte
	// rounds: argon2id passes, PBKDF2 iterations, bcrypt cost.
	rounds uint32
	memory uint32 // argon2id, KiB
	lanes  uint8  // argon2id
	valid  bool
}

// Scheme reports the hash's scheme.
func (h Hash) Scheme() Scheme { return h.scheme }

// Valid reports whether h is a hash (the zero Hash is not).
func (h Hash) Valid() bool { return h.valid }

// Plain reports whether the hash is a password in plain text.
func (h Hash) Plain() bool { return h.valid && h.scheme == Plain }

// Equal reports whether h and o are the same hash (the same password under
// the same salt and parameters).
func (h Hash) Equal(o Hash) bool {
	return h.valid == o.valid && h.scheme == o.scheme && h.rounds == o.rounds && h.memory == o.memory &&
		h.lanes == o.lanes && string(h.encoded) == string(o.encoded) && string(h.salt) == string(o.salt) && string(h.key) == string(o.key)
}

// Parse reads a hash (or, without a leading '$', a plain-text password).
func Parse(s string) (Hash, error) {
	if !strings.HasPrefix(s, "$") {
		if s == "" {
			return Hash{}, fmt.Errorf("%w: empty", ErrInvalidHash)
		}
		sum := sha256.Sum256([]byte(s))
		return Hash{scheme: Plain, encoded: sum[:], valid: true}, nil
	}
	switch {
	case strings.HasPrefix(s, "$argon2id$"):
		return parseArgon2id(s)
	case strings.HasPrefix(s, "$2a$"), strings.HasPrefix(s, "$2b$"), strings.HasPrefix(s, "$2y$"):
		cost, err := bcrypt.Cost([]byte(s))
		if err != nil {
			return Hash{}, fmt.Errorf("%w: bcrypt: %v", ErrInvalidHash, err)
		}
		if cost > MaxBcryptCost {
			return Hash{}, fmt.Errorf("%w: bcrypt cost %d is above %d", ErrInvalidHash, cost, MaxBcryptCost)
		}
		return Hash{scheme: Bcrypt, encoded: []byte(s), rounds: uint32(cost), valid: true}, nil
	case strings.HasPrefix(s, "$7$"):
		return parseMosquitto7(s)
	case strings.HasPrefix(s, "$6$"):
		parts := strings.Split(s, "$") // "", "6", salt, key
		if len(parts) != 4 {
			return Hash{}, fmt.Errorf("%w: sha512 ($6$): want $6$<salt>$<hash>", ErrInvalidHash)
		}
		salt, key, err := saltAndKey(parts[2], parts[3], base64.StdEncoding, sha512.Size)
		if err != nil {
			return Hash{}, fmt.Errorf("%w: sha512 ($6$): %v", ErrInvalidHash, err)
		}
		return Hash{scheme: SHA512, salt: salt, key: key, valid: true}, nil
	}
	prefix, _, _ := strings.Cut(s[1:], "$")
	return Hash{}, fmt.Errorf("%w: unknown scheme $%s$ (want $argon2id$, $2b$ (bcrypt), $7$ or $6$ (mosquitto); a plain-text password may not start with '$')", ErrInvalidHash, clip(prefix))
}

func parseArgon2id(s string) (Hash, error) {
	parts := strings.Split(s, "$") // "", "argon2id", "v=19", "m=..,t=..,p=..", salt, key
	if len(parts) != 6 {
		return Hash{}, fmt.Errorf("%w: argon2id: want $argon2id$v=19$m=<KiB>,t=<passes>,p=<lanes>$<salt>$<hash>", ErrInvalidHash)
	}
	if parts[2] != "v=19" {
		return Hash{}, fmt.Errorf("%w: argon2id: version %q is not v=19", ErrInvalidHash, clip(parts[2]))
	}
	h := Hash{scheme: Argon2id, valid: true}
	var seen [3]bool
	for kv := range strings.SplitSeq(parts[3], ",") {
		k, v, _ := strings.Cut(kv, "=")
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return Hash{}, fmt.Errorf("%w: argon2id: parameter %q is not a number", ErrInvalidHash, clip(kv))
		}
		switch k {
		case "m":
			if n < 8 || n > MaxArgon2Memory {
				return Hash{}, fmt.Errorf("%w: argon2id: memory m=%d KiB is not between 8 and %d", ErrInvalidHash, n, MaxArgon2Memory)
			}
			h.memory, seen[0] = uint32(n), true
		case "t":
			if n < 1 || n > MaxArgon2Passes {
				return Hash{}, fmt.Errorf("%w: argon2id: passes t=%d is not between 1 and %d", ErrInvalidHash, n, MaxArgon2Passes)
			}
			h.rounds, seen[1] = uint32(n), true
		case "p":
			if n < 1 || n > MaxArgon2Lanes {
				return Hash{}, fmt.Errorf("%w: argon2id: lanes p=%d is not between 1 and %d", ErrInvalidHash, n, MaxArgon2Lanes)
			}
			h.lanes, seen[2] = uint8(n), true
		default:
			return Hash{}, fmt.Errorf("%w: argon2id: unknown parameter %q", ErrInvalidHash, clip(k))
		}
	}
	if !seen[0] || !seen[1] || !seen[2] {
		return Hash{}, fmt.Errorf("%w: argon2id: needs m, t and p", ErrInvalidHash)
	}
	var err error
	if h.salt, h.key, err = saltAndKey(parts[4], parts[5], base64.RawStdEncoding, 0); err != nil {
		return Hash{}, fmt.Errorf("%w: argon2id: %v", ErrInvalidHash, err)
	}
	return h, nil
}

func parseMosquitto7(s string) (Hash, error) {
	parts := strings.Split(s, "$") // "", "7", iterations, salt, key
	if len(parts) != 5 {
		return Hash{}, fmt.Errorf("%w: pbkdf2-sha512 ($7$): want $7$<iterations>$<salt>$<hash>", ErrInvalidHash)
	}
	n, err := strconv.ParseUint(parts[2], 10, 32)
	if err != nil || n < 1 || n > MaxPBKDF2Rounds {
		return Hash{}, fmt.Errorf("%w: pbkdf2-sha512 ($7$): iterations %q are not between 1 and %d", ErrInvalidHash, clip(parts[2]), MaxPBKDF2Rounds)
	}
	salt, key, err := saltAndKey(parts[3], parts[4], base64.StdEncoding, 0)
	if err != nil {
		return Hash{}, fmt.Errorf("%w: pbkdf2-sha512 ($7$): %v", ErrInvalidHash, err)
	}
	return Hash{scheme: PBKDF2SHA512, salt: salt, key: key, rounds: uint32(n), valid: true}, nil
}

// saltAndKey decodes a hash's salt and key; keyLen 0 allows 16 to 128 bytes.
func saltAndKey(salt64, key64 string, enc *base64.Encoding, keyLen int) (salt, key []byte, err error) {
	if len(salt64) > maxSaltLen*2 || len(key64) > maxKeyLen*2 {
		return nil, nil, errors.New("salt or hash too long")
	}
	if salt, err = enc.DecodeString(salt64); err != nil || len(salt) == 0 {
		return nil, nil, errors.New("salt is not base64")
	}
	if key, err = enc.DecodeString(key64); err != nil {
		return nil, nil, errors.New("hash is not base64")
	}
	switch {
	case keyLen > 0 && len(key) != keyLen:
		return nil, nil, fmt.Errorf("hash is %d bytes, want %d", len(key), keyLen)
	case keyLen == 0 && (len(key) < minKeyLen || len(key) > maxKeyLen):
		return nil, nil, fmt.Errorf("hash is %d bytes, want %d to %d", len(key), minKeyLen, maxKeyLen)
	}
	return salt, key, nil
}

// Verify reports whether password matches h, comparing in constant time.
func (h Hash) Verify(password []byte) bool {
	if !h.valid {
		return false
	}
	var got []byte
	switch h.scheme {
	case Plain:
		sum := sha256.Sum256(password)
		return subtle.ConstantTimeCompare(sum[:], h.encoded) == 1
	case Bcrypt:
		return bcrypt.CompareHashAndPassword(h.encoded, password) == nil
	case Argon2id:
		got = argon2.IDKey(password, h.salt, h.rounds, h.memory, h.lanes, uint32(len(h.key)))
	case PBKDF2SHA512:
		var err error
		if got, err = pbkdf2.Key(sha512.New, string(password), h.salt, int(h.rounds), len(h.key)); err != nil {
			return false
		}
	case SHA512:
		d := sha512.New()
		d.Write(password)
		d.Write(h.salt)
		got = d.Sum(nil)
	}
	return subtle.ConstantTimeCompare(got, h.key) == 1
}

// Dummy returns a hash of the same scheme and parameters as h, of a random
// password, for verifying the password of a user that does not exist at
// the cost of one that does.
func (h Hash) Dummy() Hash {
	d := h
	d.salt = randomBytes(max(len(h.salt), 8))
	d.key = randomBytes(max(len(h.key), minKeyLen))
	switch h.scheme {
	case Plain:
		d.encoded = randomBytes(sha256.Size)
	case Bcrypt:
		enc, err := bcrypt.GenerateFromPassword(randomBytes(16), int(h.rounds))
		if err != nil {
			return defaultDummy()
		}
		d.encoded = enc
	}
	return d
}

// defaultDummy is Dummy of a hash New would write.
func defaultDummy() Hash {
	return Hash{scheme: Argon2id, salt: randomBytes(argon2SaltLen), key: randomBytes(argon2KeyLen),
		rounds: DefaultArgon2Passes, memory: DefaultArgon2Memory, lanes: 1, valid: true}
}

// Cost is a rough order of a hash's verification cost, for picking the
// dummy of a set of hashes: higher costs more.
func (h Hash) Cost() uint64 {
	switch h.scheme {
	case Argon2id:
		return uint64(h.memory) * uint64(h.rounds) * 4
	case Bcrypt:
		return 1 << h.rounds * 8
	case PBKDF2SHA512:
		return uint64(h.rounds) * 2
	}
	return 1
}

// New hashes password with scheme (Argon2id or Bcrypt) and returns its
// encoded form.
func New(password []byte, scheme Scheme) (string, error) {
	return newHash(password, scheme, cost{DefaultArgon2Memory, DefaultArgon2Passes, DefaultBcryptCost})
}

// cost holds the parameters New writes.
type cost struct {
	argon2Memory, argon2Passes uint32
	bcrypt                     int
}

func newHash(password []byte, scheme Scheme, c cost) (string, error) {
	if len(password) == 0 {
		return "", errors.New("passwd: empty password")
	}
	switch scheme {
	case Argon2id:
		salt := randomBytes(argon2SaltLen)
		key := argon2.IDKey(password, salt, c.argon2Passes, c.argon2Memory, 1, argon2KeyLen)
		return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, c.argon2Memory, c.argon2Passes, 1,
			base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key)), nil
	case Bcrypt:
		enc, err := bcrypt.GenerateFromPassword(password, c.bcrypt)
		if err != nil {
			return "", fmt.Errorf("passwd: bcrypt: %w", err) // longer than 72 bytes
		}
		return string(enc), nil
	case PBKDF2SHA512: // mosquitto's format, for tests and interop
		salt := randomBytes(mosquittoSaltLen)
		key, err := pbkdf2.Key(sha512.New, string(password), salt, 101, sha512.Size)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("$7$101$%s$%s", base64.StdEncoding.EncodeToString(salt), base64.StdEncoding.EncodeToString(key)), nil
	}
	return "", fmt.Errorf("passwd: cannot write %s hashes (want argon2id or bcrypt)", scheme)
}

// ParseScheme reads a scheme name New can write: argon2id or bcrypt.
func ParseScheme(name string) (Scheme, error) {
	switch strings.ToLower(name) {
	case "argon2id", "argon2":
		return Argon2id, nil
	case "bcrypt":
		return Bcrypt, nil
	}
	return 0, fmt.Errorf("passwd: unknown hash %q (want argon2id or bcrypt)", clip(name))
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics on a broken system source)
	return b
}

// clip bounds a string quoted in an error.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
