package persistence

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// ManifestName is the last file of a backup: what it holds, with sizes and
// checksums. A backup without it did not finish.
const ManifestName = "MANIFEST.json"

// ManifestFormat is the version of the manifest's own layout.
const ManifestFormat = 1

// Manifest describes a backup: the moment it is consistent at and every
// file it holds.
type Manifest struct {
	// Format is ManifestFormat; DataFormat the format of keyline.db it holds.
	Format     int    `json:"format"`
	DataFormat uint64 `json:"data_format"`
	// Created is when the backup's snapshot was taken; Commit is the bbolt
	// transaction it copied: everything committed (acknowledged) before
	// it is in the backup.
	Created time.Time `json:"created"`
	Commit  uint64    `json:"commit"`
	// Files lists keyline.db first, then the segment files, by name
	// relative to the data directory.
	Files []ManifestFile `json:"files"`
}

// ManifestFile is one file of a backup.
type ManifestFile struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// BackupStats are the figures of one backup, for the log and the tests.
type BackupStats struct {
	// SnapshotTime is how long the bbolt read transaction was open (writers
	// that must grow the file wait for it to end); Total the whole backup.
	SnapshotTime, Total time.Duration
	Bytes               int64
}

// backupTmpPrefix names the temporary copy of keyline.db a backup makes
// inside the data directory (removed when the backup ends, and at Open if a
// crash left one behind).
const backupTmpPrefix = ".keyline.db.backup-"

// Backup writes a consistent snapshot of the data directory to w as a tar
// stream while the store serves: keyline.db as of one read transaction,
// the segment files up to what that transaction can refer to, and the
// manifest last. Everything committed before the transaction began is in
// it (seglog.Backup documents why the two parts agree).
//
// The database is copied to a temporary file in the data directory first,
// so that the read transaction lasts as long as a local file copy, not as
// long as a slow reader of w: while it is open, a commit that must grow
// the file waits for it (bbolt's remap).
func (db *DB) Backup(w io.Writer) (Manifest, BackupStats, error) {
	start := time.Now()
	var st BackupStats
	lb, err := db.groups.log.StartBackup()
	if err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup: %w", err)
	}
	defer lb.Close()
	tmp, err := os.CreateTemp(filepath.Dir(db.path), backupTmpPrefix+"*")
	if err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup: %w", err)
	}
	defer func() {
		tmp.Close()
		os.Remove(tmp.Name())
	}()
	m := Manifest{Format: ManifestFormat}
	txStart := time.Now()
	tx, err := db.bolt.Begin(false)
	if err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup: %w", err)
	}
	m.Commit, m.Created = uint64(tx.ID()), txStart.UTC()
	m.DataFormat = readFormat(tx)
	segs, err := lb.Seal()
	if err == nil {
		_, err = tx.WriteTo(tmp)
	}
	if rerr := tx.Rollback(); err == nil {
		err = rerr
	}
	st.SnapshotTime = time.Since(txStart)
	if err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup %s: %w", FileName, err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup: %w", err)
	}
	fi, err := tmp.Stat()
	if err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup: %w", err)
	}

	tw := tar.NewWriter(w)
	add := func(name string, size int64, copyTo func(io.Writer) error) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: size, ModTime: m.Created, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		h := sha256.New()
		if err := copyTo(io.MultiWriter(tw, h)); err != nil {
			return err
		}
		m.Files = append(m.Files, ManifestFile{Name: name, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))})
		st.Bytes += size
		return nil
	}
	if err := add(FileName, fi.Size(), func(w io.Writer) error { _, err := io.Copy(w, tmp); return err }); err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup %s: %w", FileName, err)
	}
	for _, s := range segs {
		name := path.Join(SegmentsDir, s.Name)
		if err := add(name, s.Size, func(w io.Writer) error { return lb.CopySegment(w, s) }); err != nil {
			return Manifest{}, st, fmt.Errorf("persistence: backup %s: %w", name, err)
		}
	}
	body, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, st, err
	}
	body = append(body, '\n')
	if err := tw.WriteHeader(&tar.Header{Name: ManifestName, Mode: 0o600, Size: int64(len(body)), ModTime: m.Created, Typeflag: tar.TypeReg}); err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup: %w", err)
	}
	if _, err := tw.Write(body); err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup: %w", err)
	}
	if err := tw.Close(); err != nil {
		return Manifest{}, st, fmt.Errorf("persistence: backup: %w", err)
	}
	st.Total = time.Since(start)
	return m, st, nil
}

// readFormat is the data format a transaction of keyline.db records (0 if
// it records none).
func readFormat(tx *bolt.Tx) uint64 {
	f, _ := formatOf(tx)
	return f
}

// ErrBadBackup is returned for a backup that is partial, damaged or not a
// keyline backup.
var ErrBadBackup = errors.New("persistence: bad backup")

// ExtractBackup reads a backup's tar stream (as Backup writes it) into the
// directory dir, which must be empty or not exist, and verifies it
// (VerifyBackup). A stream that ends before its manifest leaves a partial
// directory behind and fails with ErrBadBackup.
func ExtractBackup(r io.Reader, dir string) (Manifest, error) {
	if err := emptyDir(dir); err != nil {
		return Manifest{}, err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Manifest{}, fmt.Errorf("%w: reading the stream: %v", ErrBadBackup, err)
		}
		name, ok := backupPath(h.Name)
		if !ok || h.Typeflag != tar.TypeReg {
			return Manifest{}, fmt.Errorf("%w: unexpected entry %q", ErrBadBackup, h.Name)
		}
		if err := writeFile(filepath.Join(dir, name), tr); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return Manifest{}, fmt.Errorf("%w: the stream ends inside %s: the backup did not finish", ErrBadBackup, h.Name)
			}
			return Manifest{}, err
		}
	}
	return VerifyBackup(dir)
}

// backupPath turns a tar entry's name into a path under the backup's
// directory: keyline.db, MANIFEST.json or segments/<file>, nothing else.
func backupPath(name string) (string, bool) {
	switch name {
	case FileName, ManifestName:
		return name, true
	}
	dir, file := path.Split(name)
	if dir != SegmentsDir+"/" || file == "" || strings.ContainsAny(file, `/\`) || file == "." || file == ".." {
		return "", false
	}
	return filepath.Join(SegmentsDir, file), true
}

// VerifyBackup checks a backup directory against its manifest: every file
// the manifest lists is there with its size and checksum, and nothing else.
func VerifyBackup(dir string) (Manifest, error) {
	var m Manifest
	body, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if errors.Is(err, os.ErrNotExist) {
		return m, fmt.Errorf("%w: %s has no %s: the backup did not finish", ErrBadBackup, dir, ManifestName)
	}
	if err != nil {
		return m, fmt.Errorf("%w: %v", ErrBadBackup, err)
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return m, fmt.Errorf("%w: %s: %v", ErrBadBackup, filepath.Join(dir, ManifestName), err)
	}
	if m.Format != ManifestFormat {
		return m, fmt.Errorf("%w: %s is of manifest format %d; this keyline reads %d", ErrBadBackup, filepath.Join(dir, ManifestName), m.Format, ManifestFormat)
	}
	if len(m.Files) == 0 || m.Files[0].Name != FileName {
		return m, fmt.Errorf("%w: %s does not list %s first", ErrBadBackup, filepath.Join(dir, ManifestName), FileName)
	}
	listed := map[string]bool{ManifestName: true}
	for _, f := range m.Files {
		name, ok := backupPath(f.Name)
		if !ok {
			return m, fmt.Errorf("%w: the manifest lists %q", ErrBadBackup, f.Name)
		}
		listed[name] = true
		p := filepath.Join(dir, name)
		sum, size, err := hashFile(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return m, fmt.Errorf("%w: %s is missing", ErrBadBackup, p)
		case err != nil:
			return m, fmt.Errorf("%w: %v", ErrBadBackup, err)
		case size != f.Size:
			return m, fmt.Errorf("%w: %s has %d bytes, the manifest says %d", ErrBadBackup, p, size, f.Size)
		case sum != f.SHA256:
			return m, fmt.Errorf("%w: %s does not match its checksum", ErrBadBackup, p)
		}
	}
	extra := func(rel string) error {
		if !listed[rel] {
			return fmt.Errorf("%w: %s is not in the manifest", ErrBadBackup, filepath.Join(dir, rel))
		}
		return nil
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return m, fmt.Errorf("%w: %v", ErrBadBackup, err)
	}
	for _, e := range ents {
		if e.Name() == SegmentsDir && e.IsDir() {
			segs, err := os.ReadDir(filepath.Join(dir, SegmentsDir))
			if err != nil {
				return m, fmt.Errorf("%w: %v", ErrBadBackup, err)
			}
			for _, s := range segs {
				if err := extra(filepath.Join(SegmentsDir, s.Name())); err != nil {
					return m, err
				}
			}
			continue
		}
		if err := extra(e.Name()); err != nil {
			return m, err
		}
	}
	return m, nil
}

// Restore copies a verified backup directory into dataDir, which must be
// empty or not exist, and checks the result as `keyline check` does; a
// restore that fails removes what it wrote.
func Restore(from, dataDir string) (Manifest, error) {
	m, err := VerifyBackup(from)
	if err != nil {
		return m, err
	}
	if m.DataFormat > FormatVersion {
		return m, fmt.Errorf("%w: %s holds data of format %d; this keyline reads formats up to %d", ErrBadBackup, from, m.DataFormat, FormatVersion)
	}
	if err := emptyDir(dataDir); err != nil {
		return m, err
	}
	fail := func(err error) (Manifest, error) {
		for _, f := range m.Files {
			name, _ := backupPath(f.Name)
			os.Remove(filepath.Join(dataDir, name))
		}
		os.Remove(filepath.Join(dataDir, SegmentsDir))
		return m, err
	}
	for _, f := range m.Files {
		name, _ := backupPath(f.Name)
		src, err := os.Open(filepath.Join(from, name))
		if err != nil {
			return fail(err)
		}
		err = writeFile(filepath.Join(dataDir, name), src)
		src.Close()
		if err != nil {
			return fail(err)
		}
	}
	for _, d := range []string{filepath.Join(dataDir, SegmentsDir), dataDir} {
		if err := syncDirectory(d); err != nil {
			return fail(err)
		}
	}
	rep, err := CheckDir(dataDir)
	if err != nil {
		return fail(err)
	}
	if len(rep.Problems) > 0 {
		return fail(fmt.Errorf("%w: the restored data dir does not check: %s", ErrBadBackup, rep.Problems[0]))
	}
	return m, nil
}

// emptyDir makes sure dir exists and holds nothing.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("persistence: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("persistence: %w", err)
	}
	for _, e := range ents {
		if e.Name() != "lost+found" {
			return fmt.Errorf("persistence: %s is not empty (it holds %s)", dir, e.Name())
		}
	}
	return nil
}

// writeFile writes r to a new file at p (and its directory), flushed.
func writeFile(p string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return fmt.Errorf("persistence: %w", err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("persistence: %w", err)
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("persistence: write %s: %w", p, err)
	}
	return nil
}

func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	var h hash.Hash = sha256.New()
	n, err := io.Copy(h, f)
	return hex.EncodeToString(h.Sum(nil)), n, err
}

func syncDirectory(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer d.Close()
	return d.Sync()
}

// removeBackupLeftovers deletes the temporary database copies of backups a
// crash interrupted.
func removeBackupLeftovers(dir string) {
	leftovers, _ := filepath.Glob(filepath.Join(dir, backupTmpPrefix+"*"))
	for _, p := range leftovers {
		os.Remove(p)
	}
}
