package passwd

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Vectors written by other tools: mosquitto_passwd 2.0.11 (Debian), glibc's
// crypt(3) for bcrypt, and the argon2 reference implementation's test suite.
var vectors = []struct {
	name, hash, password string
	scheme               Scheme
}{
	{"mosquitto_passwd 2.0 default", "$7$101$Ya+GuArLBln63Ihg$UqqP8Cd6wEwCHhTUTckh6OtnsHqSHzxULmYqmjWP5OCICBHSVnW7pESHJy3PzUppSXiP+lca7qxBNsLpCycPQQ==", "s3cret", PBKDF2SHA512},
	{"mosquitto_passwd, a password with ':' and ' '", "$7$101$o78I1XFxtyEai8cP$gVcPPFhZPq8GLLhu4o1tC1CGcT8m3X2yMzNrbp8xvOHcQvFNfkAJDb+8NUAM2rg7BlgkQCife2sOKklzPJcV1g==", "p:w d", PBKDF2SHA512},
	{"mosquitto_passwd -H sha512", "$6$R3IQQipJD2cnGznh$A34eCBhQn1OlYEVhxOWT4NjRysf49uHVkuSQnSLpx3jvdz5/DBWDjMqXOkN4lqjJ1i5KSqZEOwJMT840C5KYXg==", "hunter2", SHA512},
	{"glibc crypt bcrypt", "$2b$04$B4EyV9ykBN.oy6VQn43hj.bpPO4zvitua.vdePUmVZGuey/Lvbxbu", "correct horse", Bcrypt},
	{"argon2 reference test.c", "$argon2id$v=19$m=65536,t=2,p=1$c29tZXNhbHQ$CTFhFdXPJO1aFaMaO6Mm5c8y7cJHAph8ArZWb2GRPPc", "password", Argon2id},
	{"plain text", "hunter2", "hunter2", Plain},
}

func TestVerifyVectors(t *testing.T) {
	for _, v := range vectors {
		t.Run(v.name, func(t *testing.T) {
			h, err := Parse(v.hash)
			if err != nil {
				t.Fatal(err)
			}
			if h.Scheme() != v.scheme {
				t.Fatalf("scheme %v, want %v", h.Scheme(), v.scheme)
			}
			if !h.Verify([]byte(v.password)) {
				t.Fatalf("%q does not verify", v.password)
			}
			if h.Cost() > 1<<18 {
				return // 64 MiB argon2id takes seconds under the race detector; TestNewRoundTrips checks the rest on a cheap one
			}
			for _, wrong := range []string{v.password + "x", v.password[:len(v.password)-1]} {
				if h.Verify([]byte(wrong)) {
					t.Fatalf("wrong password %q verifies", wrong)
				}
			}
			d := h.Dummy()
			if d.Scheme() != h.Scheme() || d.Verify([]byte(v.password)) {
				t.Fatalf("dummy %v verifies the password or has another scheme", d)
			}
			if h.Plain() != (v.scheme == Plain) {
				t.Fatalf("Plain() = %v", h.Plain())
			}
		})
	}
}

func TestNewRoundTrips(t *testing.T) {
	for _, s := range []Scheme{Argon2id, Bcrypt, PBKDF2SHA512} {
		enc, err := newHash([]byte("pässword"), s, testCost)
		if err != nil {
			t.Fatal(err)
		}
		h, err := Parse(enc)
		if err != nil {
			t.Fatalf("%s: %q: %v", s, enc, err)
		}
		if h.Scheme() != s || !h.Verify([]byte("pässword")) || h.Verify([]byte("password")) {
			t.Fatalf("%s: %q does not round-trip", s, enc)
		}
		again, _ := newHash([]byte("pässword"), s, testCost)
		if again == enc {
			t.Fatalf("%s: two hashes of one password are equal (no salt?)", s)
		}
	}
	if _, err := New(nil, Argon2id); err == nil {
		t.Fatal("an empty password was hashed")
	}
	if _, err := New([]byte("x"), SHA512); err == nil {
		t.Fatal("New wrote a $6$ hash")
	}
}

func TestParseRefuses(t *testing.T) {
	for _, bad := range []string{
		"",
		"$",
		"$5$salt$hash",
		"$argon2i$v=19$m=65536,t=2,p=1$c29tZXNhbHQ$CTFhFdXPJO1aFaMaO6Mm5c8y7cJHAph8ArZWb2GRPPc",
		"$argon2id$v=16$m=65536,t=2,p=1$c29tZXNhbHQ$CTFhFdXPJO1aFaMaO6Mm5c8y7cJHAph8ArZWb2GRPPc",
		"$argon2id$v=19$m=4194304,t=2,p=1$c29tZXNhbHQ$CTFhFdXPJO1aFaMaO6Mm5c8y7cJHAph8ArZWb2GRPPc", // 4 GiB
		"$argon2id$v=19$m=65536,t=0,p=1$c29tZXNhbHQ$CTFhFdXPJO1aFaMaO6Mm5c8y7cJHAph8ArZWb2GRPPc",
		"$argon2id$v=19$m=65536,t=2$c29tZXNhbHQ$CTFhFdXPJO1aFaMaO6Mm5c8y7cJHAph8ArZWb2GRPPc",
		"$argon2id$v=19$m=65536,t=2,p=1,x=3$c29tZXNhbHQ$CTFhFdXPJO1aFaMaO6Mm5c8y7cJHAph8ArZWb2GRPPc",
		"$argon2id$v=19$m=65536,t=2,p=1$c29tZXNhbHQ$CTFh", // short key
		"$argon2id$v=19$m=65536,t=2,p=1$!!$CTFhFdXPJO1aFaMaO6Mm5c8y7cJHAph8ArZWb2GRPPc",
		"$2b$31$B4EyV9ykBN.oy6VQn43hj.bpPO4zvitua.vdePUmVZGuey/Lvbxbu", // cost 31
		"$2b$04$short",
		"$7$0$Ya+GuArLBln63Ihg$UqqP8Cd6wEwCHhTUTckh6OtnsHqSHzxULmYqmjWP5OCICBHSVnW7pESHJy3PzUppSXiP+lca7qxBNsLpCycPQQ==",
		"$7$99999999999$Ya+GuArLBln63Ihg$UqqP8Cd6wEwCHhTUTckh6OtnsHqSHzxULmYqmjWP5OCICBHSVnW7pESHJy3PzUppSXiP+lca7qxBNsLpCycPQQ==",
		"$7$101$Ya+GuArLBln63Ihg",
		"$6$R3IQQipJD2cnGznh$A34e",
	} {
		if _, err := Parse(bad); !errors.Is(err, ErrInvalidHash) {
			t.Errorf("Parse(%q) = %v, want ErrInvalidHash", bad, err)
		}
	}
}

// testCost keeps hashing cheap under the race detector (bcrypt's default
// cost takes seconds there); TestNewDefaults checks the real defaults.
var testCost = cost{argon2Memory: 64, argon2Passes: 1, bcrypt: 4}

func TestNewDefaults(t *testing.T) {
	enc, err := New([]byte("pw"), Argon2id)
	if err != nil {
		t.Fatal(err)
	}
	if want := "$argon2id$v=19$m=7168,t=5,p=1$"; !strings.HasPrefix(enc, want) {
		t.Fatalf("New wrote %q, want %s...", enc, want)
	}
	if h, err := Parse(enc); err != nil || !h.Verify([]byte("pw")) {
		t.Fatalf("%q: %v", enc, err)
	}
}

func TestZeroHashMatchesNothing(t *testing.T) {
	var h Hash
	if h.Verify(nil) || h.Verify([]byte("")) || h.Verify([]byte("x")) {
		t.Fatal("the zero hash verified")
	}
}

func TestParseFile(t *testing.T) {
	data := "# users\nalice:" + vectors[0].hash + "\r\n\nbob:plain:text\n"
	f, err := ParseFile("pw", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Entries) != 2 || f.Entries[0].User != "alice" || f.Entries[1].User != "bob" || f.Entries[1].Line != 4 {
		t.Fatalf("entries %+v", f.Entries)
	}
	if !f.Entries[0].Hash.Verify([]byte("s3cret")) || !f.Entries[1].Hash.Verify([]byte("plain:text")) || !f.Entries[1].Hash.Plain() {
		t.Fatal("entries do not verify")
	}
	for _, c := range []struct{ data, want string }{
		{"alice\n", "pw:1: want user:hash"},
		{"ok:x\n:hash\n", "pw:2: empty user name"},
		{"alice:\n", `pw:1: user "alice" has no password`},
		{"a:x\n\na:y\n", `pw:3: user "a" again (first on line 1)`},
		{"a:$9$x\n", `pw:1: user "a": passwd: invalid password hash: unknown scheme $9$`},
	} {
		_, err := ParseFile("pw", []byte(c.data))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("ParseFile(%q) = %v, want %q...", c.data, err, c.want)
		}
	}
}

func TestFileSetDeleteWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(path, []byte("# keep me\nalice:a\nbob:b\ncarol:c\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := newHash([]byte("new"), PBKDF2SHA512, testCost)
	if err := f.Set("bob", enc); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete("alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.Set("dave", "d"); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete("nobody"); !errors.Is(err, ErrNoUser) {
		t.Fatalf("Delete(nobody) = %v", err)
	}
	for _, bad := range []string{"", "a:b", "#x", "a\nb"} {
		if err := f.Set(bad, "x"); err == nil {
			t.Fatalf("Set(%q) took a bad name", bad)
		}
	}
	if err := f.Write(); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	if st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v, want the file's own 0640", st.Mode().Perm())
	}
	g, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if want := "# keep me\nbob:" + enc + "\ncarol:c\ndave:d\n"; string(data) != want {
		t.Fatalf("file:\n%s\nwant:\n%s", data, want)
	}
	if len(g.Entries) != 3 || g.Entries[2].Line != 4 || !g.Entries[0].Hash.Verify([]byte("new")) {
		t.Fatalf("entries %+v", g.Entries)
	}
}

// TestMosquittoPasswdFile reads a file that mosquitto_passwd writes now, when
// it is installed (.ci/run installs it).
func TestMosquittoPasswdFile(t *testing.T) {
	bin, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		t.Skip("mosquitto_passwd not installed")
	}
	path := filepath.Join(t.TempDir(), "pw")
	for i, u := range []struct{ name, pass, hash string }{{"dev-1", "one", "sha512-pbkdf2"}, {"dev-2", "two 2", "sha512"}} {
		args := []string{"-H", u.hash, "-b", path, u.name, u.pass}
		if i == 0 {
			args = append([]string{"-c"}, args...)
		}
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
		}
	}
	f, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Entries) != 2 || !f.Entries[0].Hash.Verify([]byte("one")) || !f.Entries[1].Hash.Verify([]byte("two 2")) ||
		f.Entries[0].Hash.Verify([]byte("two 2")) {
		t.Fatalf("entries %+v do not verify", f.Entries)
	}
}

func FuzzParse(f *testing.F) {
	for _, v := range vectors {
		f.Add(v.hash)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := Parse(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidHash) {
				t.Fatalf("error %v is not ErrInvalidHash", err)
			}
			return
		}
		if h.Cost() > uint64(MaxArgon2Memory)*MaxArgon2Passes*4 && h.Scheme() != Bcrypt {
			t.Fatalf("%q parsed with cost %d", s, h.Cost())
		}
	})
}
