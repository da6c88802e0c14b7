package natstest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestFreePortReservedAcrossProcesses: a port FreePort handed out is not
// handed out again, in this process or another, until the test ends. The
// other process is util-linux's flock(1), which takes the same kind of lock
// (flock(2)) on the same file; it runs on the host's instruction set, so the
// test also runs where this binary does not (the armv7 tests under qemu-user
// cannot exec themselves).
func TestFreePortReservedAcrossProcesses(t *testing.T) {
	flock, err := exec.LookPath("flock")
	if err != nil {
		t.Skip("flock(1) (util-linux) is not installed:", err)
	}
	dir := filepath.Join(os.TempDir(), "keyline-natstest-ports")
	port := FreePort(t)
	if _, ok := reserve(dir, port); ok {
		t.Fatalf("port %d reserved twice in one process", port)
	}
	file := filepath.Join(dir, strconv.Itoa(port))
	// -n: do not wait; -E 3: exit 3 when the lock is held elsewhere.
	out, err := exec.Command(flock, "-n", "-E", "3", file, "true").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("another process took port %d's lock while this test holds it (flock: %v)\n%s", port, err, out)
	}
	// The control: a port nobody holds, the other process can lock.
	free := filepath.Join(t.TempDir(), "unheld")
	if out, err := exec.Command(flock, "-n", "-E", "3", free, "true").CombinedOutput(); err != nil {
		t.Fatalf("flock on an unheld file: %v\n%s", err, out)
	}
}

// TestFreePortReleasedAtTheEnd: the reservation ends with the test.
func TestFreePortReleasedAtTheEnd(t *testing.T) {
	var port int
	t.Run("holder", func(t *testing.T) { port = FreePort(t) })
	release, ok := reserve(filepath.Join(os.TempDir(), "keyline-natstest-ports"), port)
	if !ok {
		t.Fatalf("port %d still reserved after its test ended", port)
	}
	release()
}
