// SPDX-License-Identifier: MIT

package mqtt

import (
	"bytes"
	"slices"

	"github.com/mochi-mqtt/server/v2/packets"
)

// ClientProps are the CONNECT properties a client keeps for its session
// (Keyline's fork, PATCHES.md item 19). v2.7.9 kept the CONNECT's whole
// packets.Properties (256 bytes, most of it properties a CONNECT cannot
// carry), in every connected client and every offline session; these are
// the ones the server reads afterwards, with the same names.
type ClientProps struct {
	User                      []packets.UserProperty
	AuthenticationData        []byte
	AuthenticationMethod      string
	AssignedClientID          string
	SessionExpiryInterval     uint32
	MaximumPacketSize         uint32
	ReceiveMaximum            uint16
	TopicAliasMaximum         uint16
	SessionExpiryIntervalFlag bool
	RequestProblemInfo        byte
	RequestProblemInfoFlag    bool
	RequestResponseInfo       byte
}

// NewClientProps returns the properties of a CONNECT that a client keeps,
// copied (nothing in them refers to the packet).
func NewClientProps(p packets.Properties) ClientProps {
	return ClientProps{
		User:                      slices.Clone(p.User),
		AuthenticationData:        bytes.Clone(p.AuthenticationData),
		AuthenticationMethod:      p.AuthenticationMethod,
		AssignedClientID:          p.AssignedClientID,
		SessionExpiryInterval:     p.SessionExpiryInterval,
		MaximumPacketSize:         p.MaximumPacketSize,
		ReceiveMaximum:            p.ReceiveMaximum,
		TopicAliasMaximum:         p.TopicAliasMaximum,
		SessionExpiryIntervalFlag: p.SessionExpiryIntervalFlag,
		RequestProblemInfo:        p.RequestProblemInfo,
		RequestProblemInfoFlag:    p.RequestProblemInfoFlag,
		RequestResponseInfo:       p.RequestResponseInfo,
	}
}

// Copy returns a copy of p that shares no slice with it.
func (p ClientProps) Copy() ClientProps {
	p.User = slices.Clone(p.User)
	p.AuthenticationData = bytes.Clone(p.AuthenticationData)
	return p
}
