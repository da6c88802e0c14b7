package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/keyline-mq/keyline/internal/mqtttest"
)

// TestOnlineBackupAndRestore takes a backup with `keyline backup` while a
// publisher keeps publishing QoS 1 messages into a Key-Shared group and to
// an offline persistent session, restores it with `keyline restore` into a
// fresh data dir, and starts a broker on it: every message acknowledged
// before the backup began is there (in the group, in key order, and queued
// for the session). It reports how long publishes waited while the backup
// ran, beside how long they waited before.
func TestOnlineBackupAndRestore(t *testing.T) {
	p := startKeyline(t, t.TempDir(), "--segment-size", "256KiB")
	addr, httpAddr := p.addrs["tcp"], p.addrs["http"]
	dial := func(id string, clean bool) *mqtttest.V5 {
		return mqtttest.ConnectV5(t, mqtttest.Dial(t, mqtttest.TCP, addr, nil), &paho.Connect{ClientID: id, CleanStart: clean, KeepAlive: 30,
			Properties: &paho.ConnectProperties{SessionExpiryInterval: paho.Uint32(3600)}})
	}
	// The group and the session exist, with nobody connected: what is
	// published waits for them.
	m := dial("bk-member", true)
	m.Subscribe(t, paho.SubscribeOptions{Topic: "$share/bk/jobs/#", QoS: 1})
	m.Close()
	s := dial("bk-session", false)
	s.Subscribe(t, paho.SubscribeOptions{Topic: "jobs/#", QoS: 1})
	s.Close()

	pub := dial("bk-pub", true)
	type acked struct {
		seq  int
		at   time.Time
		wait time.Duration
	}
	var (
		mu   sync.Mutex
		acks []acked
	)
	stop := make(chan struct{})
	done := make(chan error, 1)
	progress := make(chan int, 1) // the count of acknowledged publishes, now and then
	go func() {
		for seq := 1; ; seq++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), mqtttest.Timeout)
			sent := time.Now()
			pr, err := pub.Client.Publish(ctx, &paho.Publish{Topic: fmt.Sprintf("jobs/%d", seq%10), QoS: 1, Payload: []byte(strconv.Itoa(seq)),
				Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: strconv.Itoa(seq % 10)}}}})
			cancel()
			if err != nil || pr.ReasonCode != 0 {
				done <- fmt.Errorf("publish %d: %v %v", seq, err, pr)
				return
			}
			mu.Lock()
			acks = append(acks, acked{seq, time.Now(), time.Since(sent)})
			mu.Unlock()
			select {
			case progress <- seq:
			default:
			}
		}
	}()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acks)
	}
	// waitFor fails only when acknowledgements stop coming: each publish
	// waits for a durable commit, so how many fit in a fixed time depends on
	// the machine (493 of 500 in 10 s once on a loaded one).
	waitFor := func(n int) {
		timeout := time.NewTimer(mqtttest.Timeout)
		defer timeout.Stop()
		for count() < n {
			select {
			case <-progress:
				timeout.Reset(mqtttest.Timeout)
			case err := <-done:
				t.Fatal(err)
			case <-timeout.C:
				t.Fatalf("only %d publishes acknowledged, none for %v", count(), mqtttest.Timeout)
			}
		}
	}
	waitFor(500)

	dir := filepath.Join(t.TempDir(), "backup")
	began := time.Now()
	out, err := exec.Command(keylineBin, "backup", "--server", "http://"+httpAddr, "--to", dir).CombinedOutput()
	ended := time.Now()
	if err != nil {
		t.Fatalf("keyline backup: %v\n%s", err, out)
	}
	t.Logf("keyline backup: %s", strings.TrimSpace(string(out)))
	waitFor(count() + 200) // publishing goes on after the backup
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	pub.Close()

	var before []int
	var waitBefore, waitDuring time.Duration
	var nDuring int
	for _, a := range acks {
		switch {
		case a.at.Before(began):
			before = append(before, a.seq)
			waitBefore = max(waitBefore, a.wait)
		case a.at.Before(ended):
			waitDuring = max(waitDuring, a.wait)
			nDuring++
		}
	}
	t.Logf("%d publishes acknowledged before the backup, %d during it (%v); longest PUBACK wait before %v, during %v",
		len(before), nDuring, ended.Sub(began).Round(time.Millisecond), waitBefore, waitDuring)

	data := filepath.Join(t.TempDir(), "restored")
	out, err = exec.Command(keylineBin, "restore", "--from", dir, "--data-dir", data).CombinedOutput()
	if err != nil {
		t.Fatalf("keyline restore: %v\n%s", err, out)
	}
	t.Logf("keyline restore: %s", strings.TrimSpace(string(out)))
	if out, err := exec.Command(keylineBin, "check", "--data-dir", data).CombinedOutput(); err != nil {
		t.Fatalf("keyline check of the restored data dir: %v\n%s", err, out)
	}

	r := startKeyline(t, data)
	addr = r.addrs["tcp"]
	for _, who := range []struct {
		id, filter string
		clean      bool
	}{{"bk-member", "$share/bk/jobs/#", true}, {"bk-session", "", false}} {
		c := dial(who.id, who.clean)
		if who.filter != "" {
			c.Subscribe(t, paho.SubscribeOptions{Topic: who.filter, QoS: 1})
		}
		got := map[int]bool{}
		lastOfKey := map[string]int{}
		for len(got) < len(before) || !hasAll(got, before) {
			msg := c.Next(t)
			seq, _ := strconv.Atoi(string(msg.Payload))
			key := msg.Topic
			if seq <= lastOfKey[key] {
				t.Fatalf("%s: %d after %d on %s: out of order", who.id, seq, lastOfKey[key], key)
			}
			lastOfKey[key] = seq
			got[seq] = true
		}
		c.Close()
	}
}

func hasAll(got map[int]bool, want []int) bool {
	return !slices.ContainsFunc(want, func(s int) bool { return !got[s] })
}
