// Package tlsconfig sets up mutual TLS on the node agent port and decides
// who may call what there.
//
// Every party holds a certificate from the operator's CA. Its role is the
// first Organizational Unit of its subject: "node" (zfs-node: serves the
// agent port and pushes to peers), "controller" (zfs-controller) or
// "operator" (a person's commands). Node certificates carry the DNS name
// ServerName, which clients verify, so nodes can be dialled by any address
// without a certificate per IP.
package tlsconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Roles, as the certificate's first OU.
const (
	RoleNode       = "node"
	RoleController = "controller"
	RoleOperator   = "operator"
	// RoleBackup is a backup target's (zfs-node target, docs/backups.md):
	// it serves the backup port, which nodes push to; it can never call
	// a node's agent port.
	RoleBackup = "backup"
)

// ServerName is the DNS name every node certificate carries.
const ServerName = "node.zfs-nomad"

// BackupServerName is the DNS name every backup target's certificate
// carries, and only theirs. Clients verify the server by one name or the
// other, so a node's certificate cannot serve as a target's, nor a
// target's as a node's.
const BackupServerName = "backup.zfs-nomad"

// serverName is the DNS name by which clients verify a server of role,
// "" for the roles that only call.
func serverName(role string) string {
	switch role {
	case RoleNode:
		return ServerName
	case RoleBackup:
		return BackupServerName
	}
	return ""
}

// Files names the PEM files of one party.
type Files struct {
	CA, Cert, Key string
}

// Set reports whether any file is named.
func (f Files) Set() bool { return f.CA != "" || f.Cert != "" || f.Key != "" }

// Material is loaded TLS material.
type Material struct {
	pool *x509.CertPool
	cert tls.Certificate
	// trust remembers the peers this material's CA bundle verified
	// (Source.checkPeer).
	trust trustCache
}

// Load reads the CA bundle and the party's certificate and key.
func Load(f Files) (*Material, error) {
	if f.CA == "" || f.Cert == "" || f.Key == "" {
		return nil, errors.New("tls: the CA, certificate and key files are all required")
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("tls: reading the CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("tls: %s holds no PEM certificate", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("tls: loading %s and %s: %w", f.Cert, f.Key, err)
	}
	return &Material{pool: pool, cert: cert}, nil
}

// leaf is the party's certificate (tls.LoadX509KeyPair parses it).
func (m *Material) leaf() *x509.Certificate { return m.cert.Leaf }

// ServerConfig requires a client certificate from the CA.
func (m *Material) ServerConfig() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{m.cert},
		ClientCAs:    m.pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS13,
	}
}

// ClientConfig presents this party's certificate and verifies the node.
func (m *Material) ClientConfig() *tls.Config { return m.clientConfigFor(ServerName) }

// clientConfigFor presents this party's certificate and verifies the
// server by name: ServerName for a node, BackupServerName for a target.
func (m *Material) clientConfigFor(name string) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{m.cert},
		RootCAs:      m.pool,
		ServerName:   name,
		MinVersion:   tls.VersionTLS13,
	}
}

// ServerCredentials are ServerConfig for gRPC.
func (m *Material) ServerCredentials() credentials.TransportCredentials {
	return credentials.NewTLS(m.ServerConfig())
}

// ClientCredentials are ClientConfig for gRPC.
func (m *Material) ClientCredentials() credentials.TransportCredentials {
	return credentials.NewTLS(m.ClientConfig())
}

// clientCredentialsFor are clientConfigFor(name) for gRPC.
func (m *Material) clientCredentialsFor(name string) credentials.TransportCredentials {
	return credentials.NewTLS(m.clientConfigFor(name))
}

// Policy maps full gRPC method names (or prefixes ending in "/") to the
// roles allowed to call them.
type Policy map[string][]string

// AgentPolicy is who may call what on a node's agent port.
var AgentPolicy = Policy{
	"/zfsnomad.agent.v1.Replication/":        {RoleNode},
	"/zfsnomad.agent.v1.Peers/":              {RoleNode},
	"/zfsnomad.agent.v1.NodeAgent/Replicate": {RoleController, RoleOperator},
	// An operator's certificate reads the work lease but cannot take it.
	"/zfsnomad.agent.v1.NodeAgent/AcquireWorkLease": {RoleController},
	// Only a person retires a node: no controller decision ever does.
	"/zfsnomad.agent.v1.NodeAgent/RetirePeer": {RoleOperator},
	"/zfsnomad.agent.v1.NodeAgent/":           {RoleController, RoleOperator},
}

// TargetPolicy is who may call what on a backup target's port
// (docs/backups.md): nodes push their volumes' backups to it and fetch
// the backups a restore granted them; the controller and operators list
// backups and grant restores; only operators delete backups. A method it
// does not name is refused to every role.
var TargetPolicy = Policy{
	"/zfsnomad.agent.v1.Replication/":         {RoleNode},
	"/zfsnomad.agent.v1.Backups/SendBackup":   {RoleNode},
	"/zfsnomad.agent.v1.Backups/ListBackups":  {RoleController, RoleOperator},
	"/zfsnomad.agent.v1.Backups/GrantRestore": {RoleController, RoleOperator},
	// Only a person deletes backups: no controller decision ever does.
	"/zfsnomad.agent.v1.Backups/DeleteBackups": {RoleOperator},
}

func (p Policy) allowed(method string) []string {
	if roles, ok := p[method]; ok {
		return roles
	}
	best := ""
	for prefix := range p {
		if strings.HasSuffix(prefix, "/") && strings.HasPrefix(method, prefix) && len(prefix) > len(best) {
			best = prefix
		}
	}
	return p[best]
}

// clientCertificate returns the verified client certificate of a call.
func clientCertificate(ctx context.Context) (*x509.Certificate, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return nil, errors.New("no peer")
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil, errors.New("no verified client certificate")
	}
	return info.State.VerifiedChains[0][0], nil
}

// NameOf returns the common name of the verified client certificate of a
// call: for a node, its node ID. ok is false when the call came without
// TLS (an insecure test port).
func NameOf(ctx context.Context) (name string, ok bool) {
	cert, err := clientCertificate(ctx)
	if err != nil {
		return "", false
	}
	return cert.Subject.CommonName, true
}

// RoleOf returns the role of the verified client certificate of a call.
func RoleOf(ctx context.Context) (string, error) {
	cert, err := clientCertificate(ctx)
	if err != nil {
		return "", err
	}
	role := roleOf(cert)
	if role == "" {
		return "", errors.New("the client certificate names no role (OU)")
	}
	return role, nil
}

// roleOf is a certificate's role: its first OU ("" for none).
func roleOf(cert *x509.Certificate) string {
	if ous := cert.Subject.OrganizationalUnit; len(ous) > 0 {
		return ous[0]
	}
	return ""
}

func (p Policy) check(ctx context.Context, method string) error {
	role, err := RoleOf(ctx)
	if err != nil {
		return status.Errorf(codes.Unauthenticated, "%s: %v", method, err)
	}
	for _, r := range p.allowed(method) {
		if r == role {
			return nil
		}
	}
	return status.Errorf(codes.PermissionDenied, "%s: a %q certificate may not call this (allowed: %v)", method, role, p.allowed(method))
}

// UnaryInterceptor enforces the policy on unary calls.
func (p Policy) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := p.check(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor enforces the policy on streaming calls.
func (p Policy) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := p.check(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}
