package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/poll"
)

// TestSIGHUPReloadsIdentity runs the binary with a password file written by
// `keyline passwd` and by Debian's mosquitto_passwd, and device certificates
// checked against a CRL; SIGHUP with a broken password file changes nothing
// (the log names file and line), then SIGHUP removes a user and revokes a
// device, both cut off while the others keep their connections.
func TestSIGHUPReloadsIdentity(t *testing.T) {
	mosquittoPasswd, err := exec.LookPath("mosquitto_passwd")
	if err != nil {
		t.Skip("mosquitto_passwd not installed (.ci/run installs mosquitto)")
	}
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "passwd")
	keylinePasswd := func(args ...string) {
		t.Helper()
		cmd := exec.Command(keylineBin, append([]string{"passwd"}, args...)...)
		cmd.Stdin = strings.NewReader("apw\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("keyline passwd %v: %v\n%s", args, err, out)
		}
	}
	keylinePasswd("-c", pwFile, "alice")
	if out, err := exec.Command(mosquittoPasswd, "-b", pwFile, "device-7", "s3cret").CombinedOutput(); err != nil {
		t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
	}
	ca := mqtttest.NewCA(t, dir, "devices")
	srv := ca.Leaf(t, "broker", mqtttest.LeafOptions{Server: true})
	sensor1 := ca.Leaf(t, "sensor-1", mqtttest.LeafOptions{})
	sensor2 := ca.Leaf(t, "sensor-2", mqtttest.LeafOptions{})
	crl := ca.CRL(t, "crl.pem")
	p := startKeyline(t, t.TempDir(), "--password-file", pwFile,
		"--tls", "127.0.0.1:0", "--wss", "127.0.0.1:0", "--tls-cert", srv.CertFile, "--tls-key", srv.KeyFile,
		"--tls-client-ca", ca.File, "--tls-client-auth", "request", "--tls-identity", "cn", "--tls-crl", crl)

	user := func(name, pw string) func(*mqtt3.ClientOptions) {
		return func(o *mqtt3.ClientOptions) { o.SetUsername(name).SetPassword(pw) }
	}
	alice := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, p.addrs["tcp"]), "alice", true, nil, user("alice", "apw"))
	alice.Subscribe(t, "devices/#", 1)
	d7 := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, p.addrs["tcp"], nil), &paho.Connect{ClientID: "d7", CleanStart: true, KeepAlive: 30,
		Username: "device-7", UsernameFlag: true, Password: []byte("s3cret"), PasswordFlag: true})
	s1 := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TLS, p.addrs["tls"], mqtttest.ClientTLS(t, ca, sensor1)), &paho.Connect{ClientID: "s1", CleanStart: true, KeepAlive: 30})
	s2 := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.WSS, p.addrs["wss"]), "s2", true, mqtttest.ClientTLS(t, ca, sensor2))
	roundTrip := func(payload string) {
		t.Helper()
		s2.Publish(t, "devices/sensor-2", 1, false, []byte(payload))
		if m := alice.Next(t); string(m.Payload()) != payload {
			t.Fatalf("alice got %q, want %q", m.Payload(), payload)
		}
	}
	roundTrip("before")

	// A broken password file: nothing changes, the log names file and line.
	good, err := os.ReadFile(pwFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pwFile, append(good, "no colon here\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitMetric(t, `keyline_config_reloads_total{result="error"}`, 1)
	if want := pwFile + ":3"; !strings.Contains(p.Logs(), want) {
		t.Errorf("the log does not name %s:\n%s", want, p.Logs())
	}
	roundTrip("after a failed reload")

	// device-7 removed with keyline passwd -D, sensor-1 revoked.
	if err := os.WriteFile(pwFile, good, 0o600); err != nil {
		t.Fatal(err)
	}
	keylinePasswd("-D", pwFile, "device-7")
	ca.CRL(t, "crl.pem", sensor1.Cert)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	p.waitMetric(t, `keyline_config_reloads_total{result="ok"}`, 1)
	for name, c := range map[string]*mqtttest.V5{"device-7": d7, "sensor-1": s1} {
		select {
		case <-c.Done():
		case <-time.After(mqtttest.Timeout):
			t.Errorf("%s is still connected after its removal", name)
		}
	}
	roundTrip("after the reload")
	if !alice.IsConnectionOpen() {
		t.Error("alice lost her connection")
	}
	if _, err := mqtttest.TryConnectV5(mqtttest.Dial(t, mqtttest.TCP, p.addrs["tcp"], nil), &paho.Connect{ClientID: "d7", CleanStart: true, KeepAlive: 30,
		Username: "device-7", UsernameFlag: true, Password: []byte("s3cret"), PasswordFlag: true}); err == nil {
		t.Error("device-7 connected after its removal")
	}
	poll.Until(t, mqtttest.Timeout, "the expiry of the server certificate is exposed", func() bool {
		return p.metric(t, `keyline_tls_certificate_expiry_seconds{certificate="server",listener="tls"}`) > 3600
	})
}
