// Command mochiplain is the plain mochi-mqtt/server baseline of the
// benchmark: the mochi version Keyline builds on, with nothing but an
// allow-all auth hook and one TCP listener (mochi's default options
// otherwise). It serves until SIGINT/SIGTERM.
//
//	mochiplain -addr 127.0.0.1:1883
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:1883", "MQTT TCP listen address")
	flag.Parse()

	server := mqtt.New(&mqtt.Options{
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err := server.AddHook(new(auth.AllowHook), nil); err != nil {
		fail(err)
	}
	if err := server.AddListener(listeners.NewTCP(listeners.Config{ID: "tcp", Address: *addr})); err != nil {
		fail(err)
	}
	if err := server.Serve(); err != nil {
		fail(err)
	}
	fmt.Fprintf(os.Stderr, "mochiplain: mochi %s serving MQTT on %s\n", mqtt.Version, *addr)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	server.Close()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "mochiplain:", err)
	os.Exit(1)
}
