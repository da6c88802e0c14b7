// Keyline: the decoders of the packets a client sends must not panic on any
// input (v2.7.9's SubscribeDecode read past the end of an MQTT 5 SUBSCRIBE
// whose last filter had no options byte, and the panic ended the broker).

package packets

import "testing"

func FuzzClientPacketDecode(f *testing.F) {
	f.Add(byte(Subscribe), byte(5), []byte{0, 1, 0, 0, 1, 'a'})
	f.Add(byte(Connect), byte(4), []byte{0, 4, 'M', 'Q', 'T', 'T', 4, 2, 0, 30, 0, 1, 'c'})
	f.Add(byte(Publish), byte(5), []byte{0, 1, 'a', 0, 1, 0})
	f.Fuzz(func(t *testing.T, typ, version byte, body []byte) {
		pk := Packet{ProtocolVersion: 4 + version%2, FixedHeader: FixedHeader{Type: typ % 16, Qos: 1, Remaining: len(body)}}
		switch pk.FixedHeader.Type {
		case Connect:
			_ = pk.ConnectDecode(body)
		case Publish:
			_ = pk.PublishDecode(body)
		case Puback:
			_ = pk.PubackDecode(body)
		case Pubrec:
			_ = pk.PubrecDecode(body)
		case Pubrel:
			_ = pk.PubrelDecode(body)
		case Pubcomp:
			_ = pk.PubcompDecode(body)
		case Subscribe:
			_ = pk.SubscribeDecode(body)
		case Unsubscribe:
			_ = pk.UnsubscribeDecode(body)
		case Disconnect:
			_ = pk.DisconnectDecode(body)
		case Auth:
			_ = pk.AuthDecode(body)
		}
	})
}

// keyline: a SUBSCRIBE's reserved option bits, Retain Handling 3 and a
// Subscription Identifier of 0 are refused; v2.7.9 took them.
func TestSubscribeValidateRefusesReservedOptions(t *testing.T) {
	decode := func(options byte, props []byte) Packet {
		t.Helper()
		body := append([]byte{0, 1}, props...)
		body = append(body, 0, 1, 'a', options)
		pk := Packet{ProtocolVersion: 5, FixedHeader: FixedHeader{Type: Subscribe, Qos: 1, Remaining: len(body)}}
		if err := pk.SubscribeDecode(body); err != nil {
			t.Fatal(err)
		}
		return pk
	}
	for _, tc := range []struct {
		name    string
		options byte
		props   []byte
		want    Code
	}{
		{"plain", 0x01, []byte{0}, CodeSuccess},
		{"subscription identifier 1", 0x01, []byte{2, PropSubscriptionIdentifier, 1}, CodeSuccess},
		{"reserved bit 6", 0x41, []byte{0}, ErrMalformedSubscriptionOptions},
		{"reserved bit 7", 0x81, []byte{0}, ErrMalformedSubscriptionOptions},
		{"retain handling 3", 0x31, []byte{0}, ErrProtocolViolationRetainHandling},
		{"subscription identifier 0", 0x01, []byte{2, PropSubscriptionIdentifier, 0}, ErrProtocolViolationZeroSubID},
	} {
		pk := decode(tc.options, tc.props)
		if got := pk.SubscribeValidate(); got != tc.want {
			t.Errorf("%s: SubscribeValidate = %v, want %v", tc.name, got, tc.want)
		}
	}
	pk := Packet{ProtocolVersion: 5, FixedHeader: FixedHeader{Type: Subscribe, Qos: 1, Remaining: 6}}
	if err := pk.SubscribeDecode([]byte{0, 1, 0, 0, 1, 'a'}); err == nil { // no options byte
		t.Fatal("SubscribeDecode took a filter without its options byte")
	}
}
