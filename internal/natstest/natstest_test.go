package natstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFreePortReservedAcrossProcesses: a port FreePort handed out is not
// handed out again, in this process or another, until the test ends.
func TestFreePortReservedAcrossProcesses(t *testing.T) {
	dir := filepath.Join(os.TempDir(), "keyline-natstest-ports")
	if p := os.Getenv("NATSTEST_TRY_PORT"); p != "" { // the other process
		port, _ := strconv.Atoi(p)
		if release, ok := reserve(dir, port); ok {
			release()
			t.Fatalf("port %d reserved here although another process holds it", port)
		}
		return
	}
	port := FreePort(t)
	if _, ok := reserve(dir, port); ok {
		t.Fatalf("port %d reserved twice in one process", port)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFreePortReservedAcrossProcesses$", "-test.v")
	cmd.Env = append(os.Environ(), "NATSTEST_TRY_PORT="+strconv.Itoa(port))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS") {
		t.Fatalf("the other process: %v\n%s", err, out)
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
