package hooks

import (
	"testing"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
)

// authEncode, retainedEncode, protocolEncode and fanoutEncode are the
// EncodePacket steps as their own OnPacketEncode hooks, called directly as
// the hooks' OnPacketEncode methods were before PacketEncoder: mochi copies
// the packet into and out of each.
type authEncode struct {
	mqtt.HookBase
	h *Auth
}

func (e *authEncode) ID() string           { return "auth" }
func (e *authEncode) Provides(b byte) bool { return b == mqtt.OnPacketEncode }
func (e *authEncode) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	e.h.EncodePacket(cl, &pk)
	return pk
}

type retainedEncode struct {
	mqtt.HookBase
	h *Retained
}

func (e *retainedEncode) ID() string           { return "retained" }
func (e *retainedEncode) Provides(b byte) bool { return b == mqtt.OnPacketEncode }
func (e *retainedEncode) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	e.h.EncodePacket(cl, &pk)
	return pk
}

type protocolEncode struct {
	mqtt.HookBase
	h *Protocol
}

func (e *protocolEncode) ID() string           { return "protocol" }
func (e *protocolEncode) Provides(b byte) bool { return b == mqtt.OnPacketEncode }
func (e *protocolEncode) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	e.h.EncodePacket(cl, &pk)
	return pk
}

type fanoutEncode struct {
	mqtt.HookBase
	h *Fanout
}

func (e *fanoutEncode) ID() string           { return "fanout" }
func (e *fanoutEncode) Provides(b byte) bool { return b == mqtt.OnPacketEncode }
func (e *fanoutEncode) OnPacketEncode(cl *mqtt.Client, pk packets.Packet) packets.Packet {
	e.h.EncodePacket(cl, &pk)
	return pk
}

// BenchmarkPacketEncode measures mochi's OnPacketEncode chain on the PUBACK
// a QoS 1 publisher gets for every publish, single node with auth: one hook
// per concern (Auth, Retained, Protocol, Fanout, as before PacketEncoder)
// against the one PacketEncoder, in the same run.
func BenchmarkPacketEncode(b *testing.B) {
	server := mqtt.New(nil)
	ledger := &auth.Ledger{Auth: auth.AuthRules{{Allow: true}}}
	creds, err := NewCredentials(ledger, nil)
	if err != nil {
		b.Fatal(err)
	}
	a := NewAuth(server, NewACL(NewAuthPolicy(ledger, creds, true)), AuthConfig{})
	s := NewRetained(server)
	p := &Protocol{}
	f := NewFanout(server, FanoutConfig{})
	cl := server.NewClient(nil, "t", "c1", false)
	cl.Properties.ProtocolVersion = 5
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: 7, ProtocolVersion: 5, ReasonCode: 1}
	for _, c := range []struct {
		name  string
		hooks []mqtt.Hook
	}{
		{"hook-per-concern", []mqtt.Hook{
			&authEncode{h: a}, &retainedEncode{h: s}, &protocolEncode{h: p}, &fanoutEncode{h: f},
		}},
		{"one-hook", []mqtt.Hook{&PacketEncoder{Auth: a, Retained: s, Protocol: p, Fanout: f}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := &mqtt.Hooks{}
			for _, hk := range c.hooks {
				if err := h.Add(hk, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if out := h.OnPacketEncode(cl, pk); out.ProtocolVersion != 4 {
					b.Fatal("the PUBACK was not marked short")
				}
			}
		})
	}
}
