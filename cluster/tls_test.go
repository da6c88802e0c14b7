package cluster

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/keyline-mq/keyline/internal/mqtttest"
	"github.com/keyline-mq/keyline/internal/natstest"
)

// TestTLSToNATS joins a NATS server that requires TLS, trusting its CA
// through Config.TLSCA (--nats-tls-ca); without it the node cannot join.
func TestTLSToNATS(t *testing.T) {
	certFile, keyFile, _ := mqtttest.SelfSigned(t, t.TempDir())
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: natstest.FreePort(t), JetStream: true, StoreDir: t.TempDir(),
		TLS: true, TLSTimeout: 5, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		NoSigs: true, NoLog: true, DisableJetStreamBanner: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	url := srv.ClientURL()

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if n, err := Start(ctx, Config{URLs: []string{url}, NodeID: "no-ca", RequestTimeout: time.Second}, Handler{}); err == nil {
		n.Close()
		t.Fatal("joined a TLS server without trusting its certificate")
	}
	n, _ := startNodeCfg(t, Config{URLs: []string{url}, NodeID: "tls", TLSCA: certFile})
	if !n.Ready() || n.Replicas() != 1 {
		t.Fatalf("ready %v replicas %d", n.Ready(), n.Replicas())
	}
}
