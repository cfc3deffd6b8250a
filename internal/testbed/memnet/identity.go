// Package memnet is the agents' mutual TLS for tests that run nodes in
// one process over in-memory connections (the fault simulation, the scale
// measurement): who dialled is known as a verified node certificate
// would tell it, without keys or handshakes.
package memnet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc/credentials"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
)

// Identity stands in for the agents' mutual TLS: the dialling side names
// its endpoint in the connection's first line, and the serving side takes
// that name as its verified client certificate's common name, role node,
// as tlsconfig reads it. So a check on who sent a call (a stream's source
// node) runs as in production, and a lying peer has a node's identity
// and nothing more.
type Identity struct {
	Name string // the dialling side's; "" on the serving side
}

func (c Identity) ClientHandshake(_ context.Context, _ string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if _, err := fmt.Fprintf(conn, "%s\n", c.Name); err != nil {
		return nil, nil, err
	}
	return conn, authInfo(""), nil
}

func (c Identity) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	// Byte by byte: what follows the line is gRPC's.
	var name []byte
	b := make([]byte, 1)
	for {
		if _, err := conn.Read(b); err != nil {
			return nil, nil, err
		}
		if b[0] == '\n' {
			break
		}
		if name = append(name, b[0]); len(name) > 64 {
			return nil, nil, errors.New("memnet identity: no name line")
		}
	}
	return conn, authInfo(string(name)), nil
}

// authInfo is what a verified TLS handshake with a node certificate named
// name gives the server ("" for none).
func authInfo(name string) credentials.TLSInfo {
	info := credentials.TLSInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	if name != "" {
		cert := &x509.Certificate{Subject: pkix.Name{CommonName: name, OrganizationalUnit: []string{tlsconfig.RoleNode}}}
		info.State = tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}
	}
	return info
}

func (c Identity) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}
func (c Identity) Clone() credentials.TransportCredentials { return c }
func (c Identity) OverrideServerName(string) error         { return nil }
