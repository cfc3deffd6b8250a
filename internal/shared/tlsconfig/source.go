package tlsconfig

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/credentials"
)

// Identity is what a party's certificate must say of it: one of Roles
// (its first OU), and, when Name is set, that name as its common name (a
// node's node_id: peers bind a node's streams and promises to it).
type Identity struct {
	Roles []string
	Name  string
}

// Source holds a party's TLS material and replaces it when its files
// change (Run) or when asked (Reload, on SIGHUP): certificates rotate
// without a restart. A connection keeps the identity it was made with;
// new connections use the newest. Material that fails the checks (check)
// is refused with the file and the reason, and the material in use is
// kept. Every call checks its peer against the material in use
// (ServerOptions, DialOptions): a CA removed from the bundle, or a
// certificate expired, is refused on connections already open too.
type Source struct {
	files Files
	want  Identity
	log   hclog.Logger
	now   func() time.Time

	// WarnBefore is how long before its expiry the log warns, hourly,
	// that the certificate in use expires (0: never).
	WarnBefore time.Duration
	// Loaded, when set, is told of every certificate put in use: the
	// expiry metric.
	Loaded func(cert *x509.Certificate)

	current atomic.Pointer[Material]
	mu      sync.Mutex  // serialises Reload
	seen    []fileStamp // the files as last read
	warned  time.Time   // the last expiry warning (Run's goroutine only)
}

// warnEvery spaces the expiry warnings.
const warnEvery = time.Hour

// NewSource loads the material of files, which must pass the checks for
// want: a party does not start with material it would refuse later.
func NewSource(files Files, want Identity, log hclog.Logger) (*Source, error) {
	return newSource(files, want, log, time.Now)
}

func newSource(files Files, want Identity, log hclog.Logger, now func() time.Time) (*Source, error) {
	s := &Source{files: files, want: want, log: log, now: now}
	m, err := s.load()
	if err != nil {
		return nil, err
	}
	s.current.Store(m)
	s.seen = stamps(files)
	return s, nil
}

// Material returns the material in use.
func (s *Source) Material() *Material { return s.current.Load() }

// Certificate returns the certificate in use.
func (s *Source) Certificate() *x509.Certificate { return s.Material().leaf() }

// Reload reads the files again and puts their material in use if it
// passes the checks; otherwise it keeps the material in use and returns
// why, naming the file.
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seen = stamps(s.files)
	m, err := s.load()
	if err != nil {
		s.log.Error("new TLS material refused; the certificate in use is kept", "error", err,
			"certificate_expires", s.Certificate().NotAfter.UTC().Format(time.RFC3339))
		return err
	}
	old := s.current.Swap(m)
	if s.Loaded != nil {
		s.Loaded(m.leaf())
	}
	s.log.Info("TLS material reloaded: new connections use the new certificate", "cert", s.files.Cert,
		"subject", m.leaf().Subject.String(), "expires", m.leaf().NotAfter.UTC().Format(time.RFC3339),
		"previous_expiry", old.leaf().NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// Run reloads whenever the files change (looked at every interval) or
// reload receives, and warns of a certificate in use near its expiry,
// until ctx ends.
func (s *Source) Run(ctx context.Context, interval time.Duration, reload <-chan os.Signal) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.warnIfExpiring()
		select {
		case <-ctx.Done():
			return
		case <-reload:
			s.log.Info("reloading the TLS material (signal)")
			_ = s.Reload() // Reload logs a refusal
		case <-t.C:
			if s.changed() {
				_ = s.Reload()
			}
		}
	}
}

func (s *Source) changed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !slices.Equal(s.seen, stamps(s.files))
}

func (s *Source) warnIfExpiring() {
	leaf, now := s.Certificate(), s.now()
	if left := leaf.NotAfter.Sub(now); s.WarnBefore > 0 && left < s.WarnBefore && now.Sub(s.warned) >= warnEvery {
		s.warned = now
		s.log.Warn("the TLS certificate in use expires soon: renew it (zfs-controller tls cert, or your CA); without it this party stops talking to the others",
			"cert", s.files.Cert, "expires", leaf.NotAfter.UTC().Format(time.RFC3339), "left", left.Round(time.Minute).String())
	}
}

// load reads the files and checks them (check).
func (s *Source) load() (*Material, error) {
	m, err := Load(s.files)
	if err != nil {
		return nil, err
	}
	if err := check(m, s.files, s.want, s.now()); err != nil {
		return nil, err
	}
	return m, nil
}

// check refuses material whose certificate is not valid now, is not
// issued by its CA bundle, does not say the identity want, or would be
// refused by the peers it is for (usableByPeers).
func check(m *Material, f Files, want Identity, now time.Time) error {
	leaf := m.leaf()
	switch {
	case leaf == nil:
		return fmt.Errorf("tls: %s: no certificate", f.Cert)
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("tls: %s is not valid yet (from %s): check the clocks, or issue it again", f.Cert, leaf.NotBefore.UTC().Format(time.RFC3339))
	case !now.Before(leaf.NotAfter):
		return fmt.Errorf("tls: %s expired on %s: issue a new one", f.Cert, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	opts := x509.VerifyOptions{Roots: m.pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("tls: %s is not issued by the CA in %s: %w", f.Cert, f.CA, err)
	}
	if role := roleOf(leaf); !slices.Contains(want.Roles, role) {
		return fmt.Errorf("tls: %s has the role (first OU) %q, want one of %v", f.Cert, role, want.Roles)
	}
	if want.Name != "" && leaf.Subject.CommonName != want.Name {
		return fmt.Errorf("tls: %s names %q (common name), but this is %q: a node's certificate must name its node_id", f.Cert, leaf.Subject.CommonName, want.Name)
	}
	return usableByPeers(m, f, now)
}

// usableByPeers refuses a certificate its peers would refuse at the
// handshake, with what to change: a node's certificate serves the agent
// port and calls its peers, a backup target's serves the backup port and
// calls nodes to restore, so each must allow serverAuth and clientAuth
// and carry the DNS name its clients verify it by (ServerName,
// BackupServerName); a controller's or an operator's only calls, and must
// allow clientAuth. The peers verify the usages along the whole chain,
// and so does this.
func usableByPeers(m *Material, f Files, now time.Time) error {
	leaf := m.leaf()
	role := roleOf(leaf)
	dns := serverName(role)
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	howTo := fmt.Sprintf("issue it again (zfs-controller tls cert -role %s), or with openssl with extendedKeyUsage=clientAuth", role)
	if dns != "" {
		usages = append(usages, x509.ExtKeyUsageServerAuth)
		howTo = fmt.Sprintf("issue it again (zfs-controller tls cert -role %s), or with openssl with extendedKeyUsage=serverAuth,clientAuth and subjectAltName=DNS:%s", role, dns)
	}
	for _, usage := range usages {
		opts := x509.VerifyOptions{Roots: m.pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}
		if _, err := leaf.Verify(opts); err != nil {
			return fmt.Errorf("tls: %s does not allow %s (extended key usage), so its peers would refuse it: %s", f.Cert, usageName[usage], howTo)
		}
	}
	if dns != "" {
		if err := leaf.VerifyHostname(dns); err != nil {
			return fmt.Errorf("tls: %s does not carry the DNS name %s, by which the other parties verify a %s certificate, so they would refuse it: %s", f.Cert, dns, role, howTo)
		}
	}
	return nil
}

var usageName = map[x509.ExtKeyUsage]string{x509.ExtKeyUsageClientAuth: "clientAuth", x509.ExtKeyUsageServerAuth: "serverAuth"}

// ServerCredentials are the newest material's ServerConfig for each new
// connection. They check the client at the handshake only: a server
// serves with ServerOptions, which check it on every call.
func (s *Source) ServerCredentials() credentials.TransportCredentials {
	return &reloadingCredentials{s: s, info: s.Material().ServerCredentials().Info()}
}

// ClientCredentials are the newest material's ClientConfig for each new
// connection. They check the server at the handshake only: a client
// dials with DialOptions, which check it on every call.
func (s *Source) ClientCredentials() credentials.TransportCredentials {
	return s.clientCredentialsFor(ServerName)
}

// clientCredentialsFor are ClientCredentials verifying the server by
// name: ServerName for a node, BackupServerName for a target.
func (s *Source) clientCredentialsFor(name string) credentials.TransportCredentials {
	return &reloadingCredentials{s: s, client: true, serverName: name, info: s.Material().clientCredentialsFor(name).Info()}
}

// reloadingCredentials make each handshake with the material in use
// then: gRPC's TLS credentials copy their tls.Config once.
type reloadingCredentials struct {
	s          *Source
	client     bool
	serverName string // a client's: the name it verifies the server by
	info       credentials.ProtocolInfo
}

func (c *reloadingCredentials) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.s.Material().clientCredentialsFor(c.serverName).ClientHandshake(ctx, authority, conn)
}

func (c *reloadingCredentials) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.s.Material().ServerCredentials().ServerHandshake(conn)
}

func (c *reloadingCredentials) Info() credentials.ProtocolInfo { return c.info }

func (c *reloadingCredentials) Clone() credentials.TransportCredentials {
	clone := *c
	return &clone
}

// OverrideServerName is deprecated in gRPC and unused: nodes are always
// verified as ServerName, backup targets as BackupServerName.
func (c *reloadingCredentials) OverrideServerName(string) error {
	return errors.New("tls: the server name is fixed: " + c.serverName)
}

// fileStamp is what tells a file changed: its size, modification time
// and inode (a template engine renames a new file into place).
type fileStamp struct {
	path  string
	size  int64
	mtime time.Time
	ino   uint64
	err   string
}

func stamps(f Files) []fileStamp {
	var out []fileStamp
	for _, path := range []string{f.CA, f.Cert, f.Key} {
		st := fileStamp{path: path}
		if fi, err := os.Stat(path); err != nil {
			st.err = err.Error()
		} else {
			st.size, st.mtime, st.ino = fi.Size(), fi.ModTime(), inode(fi)
		}
		out = append(out, st)
	}
	return out
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}
