package tlsconfig

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOperatorCA: the CA `zfs-controller tls` makes is written once,
// reopened from its files, and issues certificates that Load accepts,
// with the role and name the agent port checks.
func TestOperatorCA(t *testing.T) {
	dir := t.TempDir()
	if _, err := CreateCA(dir, "test CA", 365*24*time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateCA(dir, "test CA", time.Hour); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("a second CA in the same directory: %v, want refused", err)
	}
	for _, f := range []string{"ca.pem", "ca-key.pem"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", f, err, st.Mode().Perm())
		}
	}
	ca, err := OpenCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	files, err := ca.IssueInto(out, "client-1", RoleNode, 90*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(files); err != nil {
		t.Fatalf("loading the issued certificate: %v", err)
	}
	cert := parseCert(t, files.Cert)
	if cert.Subject.CommonName != "client-1" || len(cert.Subject.OrganizationalUnit) != 1 || cert.Subject.OrganizationalUnit[0] != RoleNode {
		t.Errorf("subject %v, want CN client-1, OU node", cert.Subject)
	}
	if len(cert.DNSNames) != 1 || cert.DNSNames[0] != ServerName {
		t.Errorf("DNS names %v, want [%s]: peers verify a node's server certificate by it", cert.DNSNames, ServerName)
	}
	if left := time.Until(cert.NotAfter); left < 89*24*time.Hour || left > 90*24*time.Hour {
		t.Errorf("valid for %v more, want 90 days", left)
	}
	pool := x509.NewCertPool()
	pool.AddCert(parseCert(t, filepath.Join(dir, "ca.pem")))
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the node certificate does not verify as a server under its CA: %v", err)
	}
}

func TestIssueRefuses(t *testing.T) {
	ca, err := CreateCA(t.TempDir(), "test CA", 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, certName, role string
		validity             time.Duration
		says                 string
	}{
		{"an unknown role", "client-1", "admin", time.Hour, "role"},
		{"no name", "", RoleNode, time.Hour, "name"},
		{"a path for a name", "../client-1", RoleNode, time.Hour, "without slashes"},
		{"the CA's own name", "ca", RoleOperator, time.Hour, "name"},
		{"outliving the CA", "client-1", RoleNode, 31 * 24 * time.Hour, "outlive its CA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := t.TempDir()
			_, err := ca.IssueInto(out, tt.certName, tt.role, tt.validity)
			if err == nil || !strings.Contains(err.Error(), tt.says) {
				t.Fatalf("%v, want an error saying %q", err, tt.says)
			}
			if left, _ := os.ReadDir(out); len(left) != 0 {
				t.Errorf("a refused certificate left files: %v", left)
			}
		})
	}
}

func TestOpenCARefusesAMismatchedKey(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	for _, dir := range []string{a, b} {
		if _, err := CreateCA(dir, "test CA", time.Hour*24); err != nil {
			t.Fatal(err)
		}
	}
	key, err := os.ReadFile(filepath.Join(b, "ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "ca-key.pem"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCA(a); err == nil || !strings.Contains(err.Error(), "is not the key of") {
		t.Errorf("OpenCA with another CA's key: %v, want refused", err)
	}
	if _, err := OpenCA(t.TempDir()); err == nil {
		t.Error("OpenCA of an empty directory succeeded")
	}
}

func parseCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
