package sessionrec

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/keyline-mq/keyline/sessionstore"
)

// full sets every field to a value whose encoding takes more than one byte
// where it can.
var full = &sessionstore.Record{ClientID: "dev-1", Owner: "n1", Persistent: true, Connected: true, Floor: 300,
	Acked: []uint64{301, 1 << 40}, DisconnectedAt: -5, State: []byte(`{"a":1}`)}

// storedFull is full at revision 129 as data format 3 stores it, written by
// the codec before it moved here (persistence.encodeRecord): the data file's
// bytes.
var storedFull = []byte{0x1, 0x81, 0x1, 0x3, 0x2, 0x6e, 0x31, 0xac, 0x2, 0x2, 0xad, 0x2,
	0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0x9, 0x7b, 0x22, 0x61, 0x22, 0x3a, 0x31, 0x7d}

// TestStoredBytes: the data file's records keep their bytes, both ways, so
// that data directories written since format 3 open as they are.
func TestStoredBytes(t *testing.T) {
	if got := Encode(full, 129); !bytes.Equal(got, storedFull) {
		t.Fatalf("encoded % x\nwant       % x", got, storedFull)
	}
	if got := Encode(&sessionstore.Record{ClientID: "x"}, 1); !bytes.Equal(got, []byte{1, 1, 0, 0, 0, 0, 0}) {
		t.Fatalf("an empty record encoded as % x", got)
	}
	got, rev, err := Decode("dev-1", storedFull)
	if err != nil || rev != 129 || !reflect.DeepEqual(got, full) {
		t.Fatalf("decoded %+v rev %d %v", got, rev, err)
	}
	if Revision(storedFull) != 129 {
		t.Fatalf("revision %d", Revision(storedFull))
	}
}

// TestRecordCodec: in both forms every field survives, a record without
// optional fields too; a cut-off or damaged record is ErrCorrupt.
func TestRecordCodec(t *testing.T) {
	empty := &sessionstore.Record{ClientID: "e"}
	for _, rec := range []*sessionstore.Record{full, empty} {
		v := Encode(rec, 77)
		got, rev, err := Decode(rec.ClientID, v)
		if err != nil || rev != 77 || !reflect.DeepEqual(got, rec) {
			t.Fatalf("keyed form: decoded %+v rev %d %v, want %+v", got, rev, err, rec)
		}
		if _, _, err := DecodeWithID(v); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("a record without its id decoded as one with it: %v", err)
		}
		w := EncodeWithID(rec, 0)
		for name, dec := range map[string]func([]byte) (*sessionstore.Record, uint64, error){
			"DecodeWithID": DecodeWithID,
			"Decode":       func(v []byte) (*sessionstore.Record, uint64, error) { return Decode("another key", v) },
		} {
			got, rev, err := dec(w)
			if err != nil || rev != 0 || !reflect.DeepEqual(got, rec) {
				t.Fatalf("%s of the form with the id: %+v rev %d %v, want %+v", name, got, rev, err, rec)
			}
		}
		if Revision(w) != 0 || Revision(EncodeWithID(rec, 5)) != 5 {
			t.Fatalf("revisions %d %d", Revision(w), Revision(EncodeWithID(rec, 5)))
		}
		// Every cut before the state (which is the rest) fails.
		for _, enc := range [][]byte{v, w} {
			for i := range len(enc) - len(rec.State) {
				if _, _, err := Decode(rec.ClientID, enc[:i]); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("a record cut at %d bytes: %v", i, err)
				}
			}
		}
	}
	v := Encode(full, 77)
	for name, bad := range map[string][]byte{
		"nil":             nil,
		"other version":   append([]byte{2}, v[1:]...),
		"json":            []byte(`{"id":"dev-1"}`),
		"unknown flag":    setFlags(v, 0x08),
		"high flag":       setFlags(v, 0x80),
		"owner too long":  {1, 1, 0, 9, 'n'},
		"acked too many":  {1, 1, 0, 0, 0, 200, 1},
		"acked cut":       {1, 1, 0, 0, 0, 2, 1},
		"varint overflow": {1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0},
	} {
		if rec, _, err := Decode("dev-1", bad); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: decoded %+v, %v", name, rec, err)
		}
	}
}

// setFlags returns a copy of v (a record at a one-byte revision) with bits
// added to its flags.
func setFlags(v []byte, bits byte) []byte {
	c := bytes.Clone(v)
	c[2] |= bits
	return c
}

// FuzzDecode: no input panics, every error is ErrCorrupt, and what
// decodes survives a round trip.
func FuzzDecode(f *testing.F) {
	f.Add(storedFull)
	f.Add(EncodeWithID(full, 0))
	f.Add(Encode(&sessionstore.Record{}, 1))
	f.Fuzz(func(t *testing.T, v []byte) {
		rec, rev, err := Decode("k", v)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if Revision(v) != rev {
			t.Fatalf("Revision %d, Decode %d", Revision(v), rev)
		}
		back, brev, err := DecodeWithID(EncodeWithID(rec, rev))
		if err != nil || brev != rev || !reflect.DeepEqual(back, rec) {
			t.Fatalf("re-encoded %+v decoded %+v %v", rec, back, err)
		}
	})
}
