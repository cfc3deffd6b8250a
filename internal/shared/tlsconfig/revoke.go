package tlsconfig

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Revocation: a certificate stops being trusted when it expires or when
// the operator removes its CA from the bundle (ca.pem); there are no
// revocation lists. The handshake checks both, but a gRPC connection
// lives for hours and carries every later call, so every call checks the
// certificates of its connection again, against the material in use at
// the call and the time of the call: the server checks the caller's
// certificate (ServerOptions), the caller the server's (DialOptions). A
// refused call fails with Unauthenticated, saying which certificate and
// why, before its handler runs on the server, and before anything of it
// (its header, its request) leaves the caller.

// ServerOptions serve mutual TLS with the newest material (ServerCredentials)
// and refuse every call whose client certificate the material in use does
// not trust at the call. Put them before other interceptors: a revoked
// party learns nothing else.
func (s *Source) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.Creds(s.ServerCredentials()),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if err := s.checkCaller(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if err := s.checkCaller(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return handler(srv, ss)
		}),
	}
}

// DialOptions dial with the newest material (ClientCredentials) and
// refuse every call on a connection whose server certificate the
// material in use does not trust at the call. The check runs as per-call
// credentials: gRPC asks them on the connection chosen for the call,
// before it sends the call's header, for unary calls and streams alike.
func (s *Source) DialOptions() []grpc.DialOption { return s.dialOptionsFor(ServerName) }

// BackupDialOptions are DialOptions for a backup target's port: the
// server is verified as a target (BackupServerName), never as a node.
func (s *Source) BackupDialOptions() []grpc.DialOption { return s.dialOptionsFor(BackupServerName) }

func (s *Source) dialOptionsFor(name string) []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(s.clientCredentialsFor(name)),
		grpc.WithPerRPCCredentials(serverCheck{s: s, name: name}),
	}
}

// checkCaller checks the client certificate of a call on the server.
func (s *Source) checkCaller(ctx context.Context, method string) error {
	var info credentials.TLSInfo
	ok := false
	if p, found := peer.FromContext(ctx); found {
		info, ok = p.AuthInfo.(credentials.TLSInfo)
	}
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s: the call came without TLS", method)
	}
	if err := s.checkPeer(info.State.PeerCertificates, "client", x509.ExtKeyUsageClientAuth, ""); err != nil {
		return status.Errorf(codes.Unauthenticated, "%s: %v", method, err)
	}
	return nil
}

// serverCheck checks, as per-call credentials, the server certificate of
// the connection a call goes out on, verified by name. It adds no
// metadata.
type serverCheck struct {
	s    *Source
	name string
}

func (c serverCheck) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	info, ok := ri.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, status.Errorf(codes.Unauthenticated, "%s: the connection is not TLS", ri.Method)
	}
	if err := c.s.checkPeer(info.State.PeerCertificates, "server", x509.ExtKeyUsageServerAuth, c.name); err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "%s: %v", ri.Method, err)
	}
	return nil, nil
}

func (serverCheck) RequireTransportSecurity() bool { return true }

// checkPeer checks the certificates a peer presented at the handshake
// (its own first) against the material in use and the time now: its
// certificate is valid now, and chains to a CA of the bundle through
// certificates all valid now, for usage (and, for a server, dnsName).
// side ("client", "server") names the peer in the error. A refusal is
// logged once per certificate and material.
func (s *Source) checkPeer(certs []*x509.Certificate, side string, usage x509.ExtKeyUsage, dnsName string) error {
	if len(certs) == 0 {
		return fmt.Errorf("the %s presented no certificate", side)
	}
	m, now, leaf := s.Material(), s.now(), certs[0]
	if m.trust.holds(usage, certs, now) {
		return nil
	}
	err := validAt(leaf, now)
	if err == nil {
		err = s.verifyPeer(m, certs, usage, dnsName, now)
	}
	if err != nil {
		err = fmt.Errorf("the %s certificate %q (serial %x, issuer %q) %w", side, leaf.Subject.String(), leaf.SerialNumber, leaf.Issuer.String(), err)
		if m.trust.firstRefusal(leaf) {
			s.log.Warn("refusing every call made with a certificate this party no longer trusts", "error", err)
		}
	}
	return err
}

// verifyPeer verifies the peer's chain with the material's CA bundle and
// remembers it for the next calls.
func (s *Source) verifyPeer(m *Material, certs []*x509.Certificate, usage x509.ExtKeyUsage, dnsName string, now time.Time) error {
	intermediates := x509.NewCertPool()
	for _, c := range certs[1:] {
		intermediates.AddCert(c)
	}
	chains, err := certs[0].Verify(x509.VerifyOptions{Roots: m.pool, Intermediates: intermediates,
		CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}, DNSName: dnsName})
	var unknown x509.UnknownAuthorityError
	switch {
	case errors.As(err, &unknown):
		return fmt.Errorf("is not issued by a CA in %s (a CA removed from the bundle revokes every certificate it issued): "+
			"the party needs a certificate from a CA in the bundle (zfs-controller tls cert)", s.files.CA)
	case err != nil:
		return fmt.Errorf("is no longer trusted: %w", err)
	}
	m.trust.add(usage, certs, chains[0])
	return nil
}

// validAt says why cert is not valid at now, or nil.
func validAt(cert *x509.Certificate, now time.Time) error {
	switch {
	case now.After(cert.NotAfter):
		return fmt.Errorf("expired at %s: the party needs a renewed certificate (zfs-controller tls cert, or its CA)", cert.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(cert.NotBefore):
		return fmt.Errorf("is not valid before %s: check the clocks, or issue it again", cert.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// trustCache remembers, for one material, the peer chains its CA bundle
// verified and when all their certificates are valid: a call on a known
// connection then costs a map lookup instead of a signature check per
// certificate. A reload makes a new material, and so starts afresh.
type trustCache struct {
	mu      sync.Mutex
	chains  map[x509.ExtKeyUsage]map[string]validity // by the peer's certificates (chainKey)
	refused map[string]bool                          // leaves whose refusal was logged
}

// validity is when every certificate of a verified chain is valid.
type validity struct{ from, until time.Time }

// maxTrusted bounds the cache: it holds one entry per peer certificate
// seen since the last reload, and is emptied when full.
const maxTrusted = 1024

func (c *trustCache) holds(usage x509.ExtKeyUsage, certs []*x509.Certificate, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	var v validity
	var ok bool
	if len(certs) == 1 {
		v, ok = c.chains[usage][string(certs[0].Raw)] // no allocation for the usual chain of one
	} else {
		v, ok = c.chains[usage][chainKey(certs)]
	}
	return ok && !now.Before(v.from) && !now.After(v.until)
}

func (c *trustCache) add(usage x509.ExtKeyUsage, certs, chain []*x509.Certificate) {
	v := validity{from: chain[0].NotBefore, until: chain[0].NotAfter}
	for _, cert := range chain[1:] {
		if cert.NotBefore.After(v.from) {
			v.from = cert.NotBefore
		}
		if cert.NotAfter.Before(v.until) {
			v.until = cert.NotAfter
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chains == nil {
		c.chains = map[x509.ExtKeyUsage]map[string]validity{}
	}
	if c.chains[usage] == nil || len(c.chains[usage]) >= maxTrusted {
		c.chains[usage] = map[string]validity{}
	}
	c.chains[usage][chainKey(certs)] = v
}

// firstRefusal reports whether leaf was not refused before.
func (c *trustCache) firstRefusal(leaf *x509.Certificate) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refused == nil || len(c.refused) >= maxTrusted {
		c.refused = map[string]bool{}
	}
	if c.refused[string(leaf.Raw)] {
		return false
	}
	c.refused[string(leaf.Raw)] = true
	return true
}

// chainKey identifies the certificates a peer presented: the same leaf
// with other intermediates may chain differently. DER is self-delimiting,
// so the concatenation is unambiguous.
func chainKey(certs []*x509.Certificate) string {
	if len(certs) == 1 {
		return string(certs[0].Raw)
	}
	raws := make([][]byte, len(certs))
	for i, c := range certs {
		raws[i] = c.Raw
	}
	return string(bytes.Join(raws, nil))
}
