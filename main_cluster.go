package main

import (
	"github.com/spf13/pflag"

	"github.com/keyline-mq/keyline/broker"
)

// clusterFlags is the "Cluster" section of keyline --help: every field of
// broker.ClusterConfig, under its YAML key.
func clusterFlags(cfg *broker.ClusterConfig) flagGroup {
	f := pflag.NewFlagSet("Cluster", pflag.ContinueOnError)
	f.StringSliceVar(&cfg.NATS, "nats", cfg.NATS, "NATS server URLs (URL[,URL...]); turns cluster mode on: sessions and retained messages live in JetStream")
	f.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this node's id, unique in the cluster (default the host name)")
	f.IntVar(&cfg.NATSReplicas, "nats-replicas", cfg.NATSReplicas, "JetStream replicas of keyline's streams and bucket (capped by the NATS cluster's size)")
	f.StringVar(&cfg.NATSCreds, "nats-creds", cfg.NATSCreds, "NATS credentials file (JWT and nkey seed)")
	f.StringVar(&cfg.NATSTLSCert, "nats-tls-cert", cfg.NATSTLSCert, "PEM client certificate for NATS (with --nats-tls-key)")
	f.StringVar(&cfg.NATSTLSKey, "nats-tls-key", cfg.NATSTLSKey, "PEM private key of --nats-tls-cert")
	f.StringVar(&cfg.NATSTLSCA, "nats-tls-ca", cfg.NATSTLSCA, "PEM CA bundle that signs the NATS servers' certificates")
	f.DurationVar(&cfg.QueueMaxAge, "nats-queue-max-age", cfg.QueueMaxAge, "QoS 1/2 messages are kept for offline sessions at most this long")
	f.Var(&cfg.QueueMaxBytes, "nats-queue-max-bytes", "and at most this many bytes, cluster-wide (e.g. 1GiB)")
	f.DurationVar(&cfg.StartTimeout, "nats-start-timeout", cfg.StartTimeout, "how long startup waits for NATS")
	return flagGroup{"Cluster (NATS JetStream; off without --nats)", f}
}
