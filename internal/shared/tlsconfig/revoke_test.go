package tlsconfig

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// clock is a Source's injectable time.
type clock struct{ t atomic.Pointer[time.Time] }

func newClock() *clock {
	c := &clock{}
	c.set(time.Now())
	return c
}

func (c *clock) now() time.Time      { return *c.t.Load() }
func (c *clock) set(t time.Time)     { c.t.Store(&t) }
func (c *clock) add(d time.Duration) { c.set(c.now().Add(d)) }

// writeBundle writes the certificates of cas into path, as one ca.pem.
func writeBundle(t *testing.T, path string, cas ...*CA) {
	t.Helper()
	var bundle []byte
	for _, ca := range cas {
		data, err := os.ReadFile(ca.File)
		if err != nil {
			t.Fatal(err)
		}
		bundle = append(bundle, data...)
	}
	if err := os.WriteFile(path, bundle, 0o600); err != nil {
		t.Fatal(err)
	}
}

// countingListener counts the connections a server accepts.
type countingListener struct {
	*bufconn.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// revocationSetup is a node agent (n1, its certificate from caA) and a
// controller (its certificate from caB, valid for an hour), each trusting
// both CAs through its own ca.pem and with its own clock, connected over
// one connection with ServerOptions and DialOptions.
type revocationSetup struct {
	caA, caB               *CA
	server, client         *Source
	serverCA, clientCA     string // their ca.pem
	serverClock, clientClk *clock
	serverDir, clientDir   string
	lis                    *countingListener
	health                 healthpb.HealthClient
}

func newRevocationSetup(t *testing.T, serverLog hclog.Logger, serverOpts ...grpc.ServerOption) *revocationSetup {
	t.Helper()
	r := &revocationSetup{caA: newTestCA(t), caB: newTestCA(t), serverClock: newClock(), clientClk: newClock()}
	r.serverDir, r.clientDir = t.TempDir(), t.TempDir()
	serverFiles, err := r.caA.IssueInto(r.serverDir, "n1", RoleNode, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	clientFiles, err := r.caB.IssueInto(r.clientDir, "controller", RoleController, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	r.serverCA, r.clientCA = filepath.Join(t.TempDir(), "ca.pem"), filepath.Join(t.TempDir(), "ca.pem")
	writeBundle(t, r.serverCA, r.caA, r.caB)
	writeBundle(t, r.clientCA, r.caA, r.caB)
	serverFiles.CA, clientFiles.CA = r.serverCA, r.clientCA
	if r.server, err = newSource(serverFiles, nodeN1, serverLog, r.serverClock.now); err != nil {
		t.Fatal(err)
	}
	controller := Identity{Roles: []string{RoleController}}
	if r.client, err = newSource(clientFiles, controller, hclog.NewNullLogger(), r.clientClk.now); err != nil {
		t.Fatal(err)
	}
	r.lis = &countingListener{Listener: bufconn.Listen(1 << 20)}
	srv := grpc.NewServer(append(r.server.ServerOptions(), serverOpts...)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(r.lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///n1", append(r.client.DialOptions(),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return r.lis.DialContext(ctx) }))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r.health = healthpb.NewHealthClient(conn)
	return r
}

// call makes a unary call and opens a stream, and returns their errors.
func (r *revocationSetup) call() (unary, stream error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, unary = r.health.Check(ctx, &healthpb.HealthCheckRequest{})
	s, err := r.health.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	return unary, err
}

// TestRevocationReachesOpenConnections: once a party's certificate
// expires, or its CA leaves the bundle of the party it talks to, the
// next call on a connection opened before is refused, by the server for
// the client's certificate and by the client for the server's, with
// Unauthenticated and the reason; changes that revoke nothing refuse
// nothing.
func TestRevocationReachesOpenConnections(t *testing.T) {
	tests := []struct {
		name   string
		change func(t *testing.T, r *revocationSetup)
		says   string // "": not refused
	}{
		{"nothing changes", func(*testing.T, *revocationSetup) {}, ""},
		{"the server renews its certificate", func(t *testing.T, r *revocationSetup) {
			if _, err := r.caA.IssueInto(r.serverDir, "n1", RoleNode, time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := r.server.Reload(); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"the server drops the client's CA", func(t *testing.T, r *revocationSetup) {
			writeBundle(t, r.serverCA, r.caA)
			if err := r.server.Reload(); err != nil {
				t.Fatal(err)
			}
		}, "client certificate"},
		{"the client drops the server's CA", func(t *testing.T, r *revocationSetup) {
			writeBundle(t, r.clientCA, r.caB)
			if err := r.client.Reload(); err != nil {
				t.Fatal(err)
			}
		}, "server certificate"},
		{"the client's certificate expires", func(_ *testing.T, r *revocationSetup) { r.serverClock.add(2 * time.Hour) }, "expired at"},
		{"the server's certificate expires", func(_ *testing.T, r *revocationSetup) { r.clientClk.add(2 * time.Hour) }, "expired at"},
		{"the client's certificate is not valid yet", func(_ *testing.T, r *revocationSetup) { r.serverClock.add(-2 * time.Hour) }, "not valid before"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRevocationSetup(t, hclog.NewNullLogger())
			if unary, stream := r.call(); unary != nil || stream != nil {
				t.Fatalf("before the change: %v, %v", unary, stream)
			}
			tt.change(t, r)
			unary, stream := r.call()
			for what, err := range map[string]error{"unary call": unary, "stream": stream} {
				switch {
				case tt.says == "" && err != nil:
					t.Errorf("%s: %v, want it served", what, err)
				case tt.says != "" && (status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), tt.says)):
					t.Errorf("%s: %v, want Unauthenticated saying %q", what, err, tt.says)
				}
			}
			if n := r.lis.accepted.Load(); n != 1 {
				t.Errorf("%d connections, want the calls on the one opened before the change", n)
			}
		})
	}
}

// TestARevokedPeerIsLoggedOnce: the refusal names the certificate and
// is logged once, not at every call.
func TestARevokedPeerIsLoggedOnce(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	r := newRevocationSetup(t, hclog.New(&hclog.LoggerOptions{Output: &syncWriter{w: &logs, mu: &mu}}))
	r.serverClock.add(2 * time.Hour)
	for range 3 {
		r.call()
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Count(logs.String(), "no longer trusts"); got != 1 || !strings.Contains(logs.String(), "CN=controller") {
		t.Errorf("%d refusals logged, want 1 naming CN=controller:\n%s", got, logs.String())
	}
}

// TestARenewedCertificateReplacesOldConnections: a client that renewed
// its certificate is refused on its old connection once the old
// certificate expires, and served again once the server's connection
// age has passed (a node's agent port sets agent.MaxConnectionAge): the
// new connection is made with the renewed certificate.
func TestARenewedCertificateReplacesOldConnections(t *testing.T) {
	const age = 300 * time.Millisecond
	r := newRevocationSetup(t, hclog.NewNullLogger(), grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: age}))
	if unary, _ := r.call(); unary != nil {
		t.Fatal(unary)
	}
	if _, err := r.caB.IssueInto(r.clientDir, "controller", RoleController, 24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := r.client.Reload(); err != nil {
		t.Fatal(err)
	}
	r.serverClock.add(2 * time.Hour) // the old certificate expired, the renewed one is valid
	waitFor(t, "call served on a new connection", func() bool {
		unary, _ := r.call()
		return unary == nil
	})
	if n := r.lis.accepted.Load(); n < 2 {
		t.Errorf("%d connections, want the call served on a new one", n)
	}
}

type syncWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// issueWith writes, as issue does, a certificate for name and role from
// ca with edit applied to its template: one IssueInto would not make.
func issueWith(t *testing.T, ca *CA, dir, name, role string, edit func(*x509.Certificate)) Files {
	t.Helper()
	files := issue(t, ca, dir, name, role) // the key and the paths
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name, OrganizationalUnit: []string{role}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{ServerName},
	}
	edit(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := writePEM(files.Key, "PRIVATE KEY", keyDER); err != nil {
		t.Fatal(err)
	}
	if err := writePEM(files.Cert, "CERTIFICATE", der); err != nil {
		t.Fatal(err)
	}
	return files
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := randomSerial()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestReloadRefusesCertificatesPeersWouldRefuse: a reload to a
// certificate the other parties would refuse at the handshake fails,
// says what is wrong and what to do, logs it, and keeps the material in
// use.
func TestReloadRefusesCertificatesPeersWouldRefuse(t *testing.T) {
	controller := Identity{Roles: []string{RoleController}}
	tests := []struct {
		name string
		want Identity
		role string
		edit func(*x509.Certificate)
		says []string
	}{
		{"a node's without serverAuth", nodeN1, RoleNode,
			func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth} },
			[]string{"does not allow serverAuth", "extendedKeyUsage=serverAuth,clientAuth"}},
		{"a node's without clientAuth", nodeN1, RoleNode,
			func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} },
			[]string{"does not allow clientAuth", "zfs-controller tls cert -role node"}},
		{"a node's without the name " + ServerName, nodeN1, RoleNode,
			func(c *x509.Certificate) { c.DNSNames = []string{"n1.example"} },
			[]string{"does not carry the DNS name " + ServerName, "subjectAltName=DNS:" + ServerName}},
		{"a controller's without clientAuth", controller, RoleController,
			func(c *x509.Certificate) { c.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth} },
			[]string{"does not allow clientAuth", "zfs-controller tls cert -role controller"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca, dir := newTestCA(t), t.TempDir()
			name := tt.want.Name
			if name == "" {
				name = "controller"
			}
			files := issue(t, ca, dir, name, tt.role)
			var logs bytes.Buffer
			s, err := NewSource(files, tt.want, hclog.New(&hclog.LoggerOptions{Output: &logs}))
			if err != nil {
				t.Fatal(err)
			}
			first := s.Certificate().SerialNumber

			issueWith(t, ca, dir, name, tt.role, tt.edit)
			err = s.Reload()
			if err == nil {
				t.Fatal("the reload put in use a certificate its peers would refuse")
			}
			for _, says := range append(tt.says, files.Cert) {
				if !strings.Contains(err.Error(), says) || !strings.Contains(logs.String(), says) {
					t.Errorf("the refusal does not say %q: %v\nlog:\n%s", says, err, logs.String())
				}
			}
			if got := s.Certificate().SerialNumber; got.Cmp(first) != 0 {
				t.Error("the refused certificate was put in use")
			}
			if _, err := NewSource(files, tt.want, hclog.NewNullLogger()); err == nil {
				t.Error("a party starts with it")
			}
		})
	}
}

// BenchmarkPeerCheck is the cost of a call's certificate check: a
// known chain (the cache), and a first or uncached one (a verify).
func BenchmarkPeerCheck(b *testing.B) {
	ca, err := CreateCA(b.TempDir(), "bench CA", 30*24*time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	files, err := ca.Issue("n1", RoleNode)
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewSource(files, nodeN1, hclog.NewNullLogger())
	if err != nil {
		b.Fatal(err)
	}
	peer, err := ca.Material("controller", RoleController)
	if err != nil {
		b.Fatal(err)
	}
	certs := []*x509.Certificate{peer.leaf()}
	b.Run("known", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := s.checkPeer(certs, "client", x509.ExtKeyUsageClientAuth, ""); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := s.verifyPeer(&Material{pool: s.Material().pool}, certs, x509.ExtKeyUsageClientAuth, "", time.Now()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
