package integration

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// needMosquittoClients returns the paths of mosquitto_pub and mosquitto_sub.
// Under CI their absence fails the test; elsewhere it skips with a message.
func needMosquittoClients(t *testing.T) (pub, sub string) {
	t.Helper()
	pub, err1 := exec.LookPath("mosquitto_pub")
	sub, err2 := exec.LookPath("mosquitto_sub")
	if err1 != nil || err2 != nil {
		msg := "mosquitto_pub/mosquitto_sub not found: install Debian's mosquitto-clients (.ci/run does)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return pub, sub
}

// mosquittoSub starts mosquitto_sub and returns a channel of its output lines.
func mosquittoSub(t *testing.T, bin string, args ...string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*mqtttest.Timeout)
	cmd := exec.CommandContext(ctx, bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = cmd.Wait()
	})
	return lines
}

func mosquittoPub(t *testing.T, bin string, args ...string) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_pub %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func nextLine(t *testing.T, lines <-chan string) string {
	t.Helper()
	l, ok := <-lines
	if !ok {
		t.Fatal("mosquitto_sub ended early")
	}
	return l
}

func TestMosquittoClientsInteroperate(t *testing.T) {
	pubBin, subBin := needMosquittoClients(t)
	p := startKeyline(t, t.TempDir())
	host, port, err := net.SplitHostPort(p.addrs["tcp"])
	if err != nil {
		t.Fatal(err)
	}
	conn := []string{"-h", host, "-p", port}

	plain := mosquittoSub(t, subBin, append(conn, "-V", "311", "-q", "1", "-v", "-t", "sensors/#", "-C", "3")...)
	// '$share/...' is quoted for the shell in the README; exec passes it as is.
	shared := mosquittoSub(t, subBin, append(conn, "-V", "5", "-q", "1", "-v", "-t", "$share/workers/sensors/#", "-F", "%t %p %P", "-C", "3")...)
	p.waitMetric(t, "keyline_subscriptions", 2) // both SUBACKs sent

	mosquittoPub(t, pubBin, append(conn, "-V", "311", "-q", "0", "-t", "sensors/a", "-m", "qos0")...)
	mosquittoPub(t, pubBin, append(conn, "-V", "311", "-q", "1", "-t", "sensors/b", "-m", "qos1")...)
	mosquittoPub(t, pubBin, append(conn, "-V", "5", "-q", "2", "-t", "sensors/c", "-m", "qos2", "-D", "publish", "user-property", "key", "device-9")...)

	for _, want := range []string{"sensors/a qos0", "sensors/b qos1", "sensors/c qos2"} {
		if got := nextLine(t, plain); got != want {
			t.Errorf("mosquitto_sub sensors/# got %q, want %q", got, want)
		}
	}
	for _, want := range []string{"sensors/a qos0 ", "sensors/b qos1 ", "sensors/c qos2 key:device-9"} {
		if got := nextLine(t, shared); got != want {
			t.Errorf("mosquitto_sub $share/workers/sensors/# got %q, want %q", got, want)
		}
	}
}
