package tlsconfig

import (
	"bytes"
	"context"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/test/bufconn"
)

var nodeN1 = Identity{Roles: []string{RoleNode}, Name: "n1"}

// issue writes a certificate for name and role into dir, as the files a
// party reads (node.pem, node-key.pem), and returns them.
func issue(t *testing.T, ca *CA, dir, name, role string) Files {
	t.Helper()
	f, err := ca.IssueInto(dir, name, role, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	files := Files{CA: f.CA, Cert: filepath.Join(dir, "node.pem"), Key: filepath.Join(dir, "node-key.pem")}
	for from, to := range map[string]string{f.Cert: files.Cert, f.Key: files.Key} {
		if err := os.Rename(from, to); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

func newTestCA(t *testing.T) *CA {
	t.Helper()
	ca, err := CreateCA(t.TempDir(), "test CA", 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestSourceRefuses: material a party would be refused for, or would
// misuse, is refused at start and names the file and the reason.
func TestSourceRefuses(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	tests := []struct {
		name  string
		files func(dir string) Files
		now   time.Time
		says  string
	}{
		{"another node's certificate", func(dir string) Files { return issue(t, ca, dir, "n2", RoleNode) }, time.Now(), `names "n2"`},
		{"a controller's certificate", func(dir string) Files { return issue(t, ca, dir, "n1", RoleController) }, time.Now(), `role (first OU) "controller"`},
		{"expired", func(dir string) Files { return issue(t, ca, dir, "n1", RoleNode) }, time.Now().Add(48 * time.Hour), "expired on"},
		{"not valid yet", func(dir string) Files { return issue(t, ca, dir, "n1", RoleNode) }, time.Now().Add(-48 * time.Hour), "not valid yet"},
		{"from another CA", func(dir string) Files {
			f := issue(t, other, dir, "n1", RoleNode)
			f.CA = ca.File
			return f
		}, time.Now(), "not issued by the CA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := tt.files(t.TempDir())
			_, err := newSource(files, nodeN1, hclog.NewNullLogger(), func() time.Time { return tt.now })
			if err == nil || !strings.Contains(err.Error(), tt.says) || !strings.Contains(err.Error(), files.Cert) {
				t.Fatalf("%v, want an error naming %s and saying %q", err, files.Cert, tt.says)
			}
		})
	}
}

// TestReloadKeepsGoodMaterial: a renewed certificate is put in use; one
// that fails the checks is refused and the one in use kept.
func TestReloadKeepsGoodMaterial(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	files := issue(t, ca, dir, "n1", RoleNode)
	var logs bytes.Buffer
	s, err := NewSource(files, nodeN1, hclog.New(&hclog.LoggerOptions{Output: &logs}))
	if err != nil {
		t.Fatal(err)
	}
	first := s.Material().leaf().SerialNumber

	issue(t, ca, dir, "n2", RoleNode) // a wrong certificate lands
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), `names "n2"`) {
		t.Fatalf("reloading another node's certificate: %v, want refused", err)
	}
	if got := s.Material().leaf().SerialNumber; got.Cmp(first) != 0 {
		t.Fatal("a refused certificate was put in use")
	}
	if !strings.Contains(logs.String(), "certificate in use is kept") {
		t.Errorf("the refusal was not logged:\n%s", logs.String())
	}

	issue(t, ca, dir, "n1", RoleNode) // the renewal
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := s.Material().leaf().SerialNumber; got.Cmp(first) == 0 {
		t.Fatal("the renewed certificate was not put in use")
	}
}

// TestRunReloadsOnChangeAndSignal: Run notices new files, and reloads on
// the signal even when the files look unchanged.
func TestRunReloadsOnChangeAndSignal(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	files := issue(t, ca, dir, "n1", RoleNode)
	s, err := NewSource(files, nodeN1, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var loaded []string
	s.Loaded = func(c *x509.Certificate) {
		mu.Lock()
		defer mu.Unlock()
		loaded = append(loaded, c.SerialNumber.String())
	}
	reload := make(chan os.Signal, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx, 10*time.Millisecond, reload)

	before := s.Material().leaf().SerialNumber
	issue(t, ca, dir, "n1", RoleNode)
	waitFor(t, "the changed files put in use", func() bool { return s.Material().leaf().SerialNumber.Cmp(before) != 0 })

	mu.Lock()
	n := len(loaded)
	mu.Unlock()
	reload <- syscall.SIGHUP
	waitFor(t, "a reload on the signal", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(loaded) > n
	})
}

// TestExpiryWarning: from WarnBefore before its expiry, the log warns
// of the certificate in use, once an hour.
func TestExpiryWarning(t *testing.T) {
	ca := newTestCA(t)
	files := issue(t, ca, t.TempDir(), "n1", RoleNode) // valid for a day
	for _, tt := range []struct {
		warnBefore time.Duration
		warns      bool
	}{{48 * time.Hour, true}, {time.Hour, false}, {0, false}} {
		var logs bytes.Buffer
		s, err := NewSource(files, nodeN1, hclog.New(&hclog.LoggerOptions{Output: &logs}))
		if err != nil {
			t.Fatal(err)
		}
		s.WarnBefore = tt.warnBefore
		s.warnIfExpiring()
		s.warnIfExpiring() // within the hour: no second warning
		if got := strings.Count(logs.String(), "expires soon"); got != map[bool]int{true: 1}[tt.warns] {
			t.Errorf("WarnBefore %v: %d warnings, want warned=%v once:\n%s", tt.warnBefore, got, tt.warns, logs.String())
		}
	}
}

// TestConnectionsUseTheNewestCertificate: through real TLS, a connection
// made after a reload sees the new certificate, and one made before keeps
// working.
func TestConnectionsUseTheNewestCertificate(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	files := issue(t, ca, dir, "n1", RoleNode)
	s, err := NewSource(files, nodeN1, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpc.Creds(s.ServerCredentials()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	client, err := ca.Material("controller", RoleController)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() (*grpc.ClientConn, healthpb.HealthClient) {
		conn, err := grpc.NewClient("passthrough:///n1", grpc.WithTransportCredentials(client.ClientCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn, healthpb.NewHealthClient(conn)
	}
	served := func(h healthpb.HealthClient) string {
		var p peer.Peer
		if _, err := h.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
			t.Fatal(err)
		}
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.String()
	}
	_, old := dial()
	first := served(old)
	issue(t, ca, dir, "n1", RoleNode)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	_, fresh := dial()
	if got := served(fresh); got == first {
		t.Error("a connection made after the reload was served with the old certificate")
	}
	if got := served(old); got != first {
		t.Errorf("the connection made before the reload changed certificate: %s, was %s", got, first)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 5 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestABundleServesAsCertificateAndKey: one file holding the certificate,
// its key and the issuing CA, as Vault's pkiCert template renders it
// (docs/security.md), serves as both -tls-cert and -tls-key: the
// certificate is its first PEM block, the key its private-key block.
func TestABundleServesAsCertificateAndKey(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	f := issue(t, ca, dir, "n1", RoleNode)
	var bundle []byte
	for _, path := range []string{f.Cert, f.Key, f.CA} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		bundle = append(bundle, data...)
	}
	path := filepath.Join(dir, "bundle.pem")
	if err := os.WriteFile(path, bundle, 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := NewSource(Files{CA: f.CA, Cert: path, Key: path}, nodeN1, hclog.NewNullLogger())
	if err != nil {
		t.Fatalf("the bundle as certificate and key: %v", err)
	}
	if got := src.Certificate().Subject.CommonName; got != "n1" {
		t.Errorf("the certificate in use names %q, want n1", got)
	}
}
