package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"go.uber.org/goleak"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tlogWriter routes the broker's logs to t.Log until the test ends.
type tlogWriter struct {
	t    testing.TB
	done atomic.Bool
}

func (w *tlogWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func testConfig(t testing.TB) Config {
	cfg := DefaultConfig()
	cfg.TCP = "127.0.0.1:0"
	cfg.HTTP = "127.0.0.1:0"
	cfg.DataDir = t.TempDir()
	cfg.Fsync = false
	cfg.SegmentSize = 1 << 20
	cfg.LogLevel = LogDebug
	return cfg
}

// startBroker starts a broker on loopback ports chosen by the kernel and
// shuts it down when the test ends.
func startBroker(t testing.TB, cfg Config) *Broker { return startBrokerWith(t, cfg, nil) }

// startBrokerWith is startBroker that calls before (if set) between New and
// Start.
func startBrokerWith(t testing.TB, cfg Config, before func(*Broker)) *Broker {
	t.Helper()
	w := &tlogWriter{t: t}
	logger := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b, err := New(cfg, logger)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if before != nil {
		before(b)
	}
	if err := b.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			buf := make([]byte, 1<<20)
			t.Errorf("Shutdown: %v; goroutines:\n%s", err, buf[:runtime.Stack(buf, true)])
		}
		w.done.Store(true)
	})
	return b
}

func TestPubSubEveryTransportVersionAndQoS(t *testing.T) {
	cfg := testConfig(t)
	cfg.WS = "127.0.0.1:0"
	cfg.TLS = "127.0.0.1:0"
	var clientTLS *tls.Config
	cfg.TLSCert, cfg.TLSKey, clientTLS = mqtttest.SelfSigned(t, t.TempDir())
	b := startBroker(t, cfg)

	for _, tr := range []mqtttest.Transport{mqtttest.TCP, mqtttest.TLS, mqtttest.WS} {
		addr := b.Addr(string(tr))
		for qos := byte(0); qos <= 2; qos++ {
			t.Run(fmt.Sprintf("%s/v5/qos%d", tr, qos), func(t *testing.T) {
				topic := fmt.Sprintf("test/%s/v5/%d", tr, qos)
				sub := mqtttest.ConnectV5(t, mqtttest.Dial(t, tr, addr, clientTLS), &paho.Connect{ClientID: "sub-" + topic, CleanStart: true, KeepAlive: 30})
				if got := sub.Subscribe(t, paho.SubscribeOptions{Topic: topic, QoS: qos}); got[0] != qos {
					t.Fatalf("SUBACK = %#x, want granted QoS %d", got[0], qos)
				}
				pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, tr, addr, clientTLS), &paho.Connect{ClientID: "pub-" + topic, CleanStart: true, KeepAlive: 30})
				for i := range 3 {
					if rc := pub.Publish(t, &paho.Publish{Topic: topic, QoS: qos, Payload: fmt.Appendf(nil, "m%d", i)}); rc >= 0x80 {
						t.Fatalf("publish reason %#x", rc)
					}
				}
				for i := range 3 {
					m := sub.Next(t)
					if want := fmt.Sprintf("m%d", i); string(m.Payload) != want || m.QoS != qos || m.Topic != topic {
						t.Fatalf("got %s %q qos %d, want %s %q qos %d", m.Topic, m.Payload, m.QoS, topic, want, qos)
					}
				}
			})
			t.Run(fmt.Sprintf("%s/v3/qos%d", tr, qos), func(t *testing.T) {
				topic := fmt.Sprintf("test/%s/v3/%d", tr, qos)
				url := mqtttest.V3URL(tr, addr)
				sub := mqtttest.ConnectV3(t, url, "sub-"+topic, true, clientTLS)
				if got := sub.Subscribe(t, topic, qos); got != qos {
					t.Fatalf("SUBACK = %#x, want granted QoS %d", got, qos)
				}
				pub := mqtttest.ConnectV3(t, url, "pub-"+topic, true, clientTLS)
				for i := range 3 {
					pub.Publish(t, topic, qos, false, fmt.Appendf(nil, "m%d", i))
				}
				for i := range 3 {
					m := sub.Next(t)
					if want := fmt.Sprintf("m%d", i); string(m.Payload()) != want || m.Qos() != qos || m.Topic() != topic {
						t.Fatalf("got %s %q qos %d, want %s %q qos %d", m.Topic(), m.Payload(), m.Qos(), topic, want, qos)
					}
				}
			})
		}
	}
}

func TestMQTT5PropertiesArriveIntact(t *testing.T) {
	b := startBroker(t, testConfig(t))
	addr := b.Addr("tcp")
	sub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "sub", CleanStart: true, KeepAlive: 30})
	sub.Subscribe(t, paho.SubscribeOptions{Topic: "req/#", QoS: 1})
	pub := mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: "pub", CleanStart: true, KeepAlive: 30})
	format := byte(1)
	sent := &paho.PublishProperties{
		ContentType:     "application/json",
		ResponseTopic:   "resp/pub",
		CorrelationData: []byte{0, 1, 2, 0xff},
		PayloadFormat:   &format,
		User:            paho.UserProperties{{Key: "key", Value: "device-7"}, {Key: "trace", Value: "a"}, {Key: "trace", Value: "b"}},
	}
	pub.Publish(t, &paho.Publish{Topic: "req/x", QoS: 1, Payload: []byte(`{"n":1}`), Properties: sent})
	got := sub.Next(t).Properties
	if got == nil {
		t.Fatal("message arrived without properties")
	}
	if got.ContentType != sent.ContentType || got.ResponseTopic != sent.ResponseTopic ||
		!bytes.Equal(got.CorrelationData, sent.CorrelationData) || got.PayloadFormat == nil || *got.PayloadFormat != 1 {
		t.Errorf("properties = %+v, want %+v", got, sent)
	}
	if fmt.Sprint(got.User) != fmt.Sprint(sent.User) {
		t.Errorf("user properties = %v, want %v in order", got.User, sent.User)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

func TestHTTPHealthAndMetrics(t *testing.T) {
	b := startBroker(t, testConfig(t))
	base := "http://" + b.Addr("http")
	if code, body := httpGet(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, _ := httpGet(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d, want 200 once started", code)
	}
	c := mqtttest.ConnectV3(t, mqtttest.V3URL(mqtttest.TCP, b.Addr("tcp")), "metrics-probe", true, nil)
	c.Subscribe(t, "m/t", 0)
	c.Publish(t, "m/t", 0, true, []byte("retained"))
	c.Next(t)
	want := []string{
		"keyline_clients_connected 1",
		"keyline_messages_received_total 1",
		"keyline_messages_sent_total 1",
		"keyline_subscriptions 1",
		"keyline_bytes_received_total",
		"keyline_bytes_sent_total",
		"keyline_messages_dropped_total 0",
		"keyline_inflight_messages 0",
		"keyline_retained_messages",
		"keyline_uptime_seconds",
		"keyline_session_store_commits_total",
		"go_goroutines",
		"process_resident_memory_bytes",
	}
	// mochi counts a sent message after its write returns, which may be after
	// the subscriber has it: poll until the figures settle.
	var missing []string
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for deadline := time.Now().Add(mqtttest.Timeout); ; <-poll.C {
		_, body := httpGet(t, base+"/metrics")
		missing = missing[:0]
		for _, w := range want {
			if !strings.Contains(body, w+"\n") && !strings.Contains(body, w+" ") {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(missing) > 0 {
		t.Errorf("/metrics lacks %q", missing)
	}
}
