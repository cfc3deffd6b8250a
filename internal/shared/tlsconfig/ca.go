package tlsconfig

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority for the agent port: the operator's, made
// and used by `zfs-controller tls` (CreateCA, OpenCA), or a throw-away one
// for tests and the demo (NewCA). Nothing made here is checked in.
type CA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate's path.
	File string
}

// The CA's files in its directory.
const (
	caCertFile = "ca.pem"
	caKeyFile  = "ca-key.pem"
)

// testValidity is how long the throw-away CA and its certificates last.
const testValidity = 7 * 24 * time.Hour

// NewCA creates a throw-away CA whose files live in dir.
func NewCA(dir string) (*CA, error) {
	return CreateCA(dir, "zfs-nomad throw-away CA", testValidity+time.Hour)
}

// CreateCA makes a CA named name, valid for validity from now, and
// writes its certificate and key (mode 0600) into dir. It refuses to
// replace a CA already there: every certificate it issued would stop
// being trusted.
func CreateCA(dir, name string, validity time.Duration) (*CA, error) {
	for _, f := range []string{caCertFile, caKeyFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s already exists: a new CA there would leave every certificate of the old one untrusted; choose another directory", filepath.Join(dir, f))
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	ca := &CA{dir: dir, cert: cert, key: key, File: filepath.Join(dir, caCertFile)}
	if err := writePEM(filepath.Join(dir, caKeyFile), "PRIVATE KEY", keyDER); err != nil {
		return nil, err
	}
	return ca, writePEM(ca.File, "CERTIFICATE", der)
}

// OpenCA loads the CA that CreateCA wrote into dir.
func OpenCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, caCertFile), filepath.Join(dir, caKeyFile)
	cert, err := readPEM(certPath, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	parsed, err := x509.ParseCertificate(cert)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certPath, err)
	}
	if !parsed.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", certPath)
	}
	keyDER, err := readPEM(keyPath, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	parsedKey, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	key, ok := parsedKey.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(parsed.PublicKey) {
		return nil, fmt.Errorf("%s is not the key of %s", keyPath, certPath)
	}
	return &CA{dir: dir, cert: parsed, key: key, File: certPath}, nil
}

// Issue makes a throw-away certificate for name with role into the CA's
// directory and returns its files.
func (ca *CA) Issue(name, role string) (Files, error) {
	return ca.IssueInto(ca.dir, name, role, testValidity)
}

// IssueInto makes a certificate for name with role (its OU), valid for
// validity from now, and writes NAME.pem and NAME-key.pem (mode 0600)
// into dir. Node certificates also carry ServerName and backup targets'
// BackupServerName, and may serve; the others may only call. A
// certificate outliving its CA is refused.
func (ca *CA) IssueInto(dir, name, role string, validity time.Duration) (Files, error) {
	switch role {
	case RoleNode, RoleController, RoleOperator, RoleBackup:
	default:
		return Files{}, fmt.Errorf("role %q: want %s, %s, %s or %s", role, RoleNode, RoleController, RoleOperator, RoleBackup)
	}
	if name == "" || filepath.Base(name) != name || name == "ca" {
		return Files{}, fmt.Errorf("name %q: want the node's node_id (Nomad: the client's name), a backup target's name, or a name for a controller or operator, without slashes", name)
	}
	notAfter := time.Now().Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		return Files{}, fmt.Errorf("a certificate valid until %s would outlive its CA (valid until %s): issue it for less, or make a new CA", notAfter.UTC().Format(time.DateOnly), ca.cert.NotAfter.UTC().Format(time.DateOnly))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Files{}, err
	}
	serial, err := randomSerial()
	if err != nil {
		return Files{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name, OrganizationalUnit: []string{role}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if dns := serverName(role); dns != "" {
		tmpl.DNSNames = []string{dns}
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Files{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Files{}, err
	}
	f := Files{CA: ca.File, Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}
	if err := writePEM(f.Key, "PRIVATE KEY", keyDER); err != nil {
		return Files{}, err
	}
	return f, writePEM(f.Cert, "CERTIFICATE", der)
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
}

func writePEM(path, typ string, der []byte) error {
	data := pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func readPEM(path, typ string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != typ {
		return nil, fmt.Errorf("%s holds no PEM %s", path, typ)
	}
	return block.Bytes, nil
}

// Material issues a certificate for name with role and loads it.
func (ca *CA) Material(name, role string) (*Material, error) {
	f, err := ca.Issue(name, role)
	if err != nil {
		return nil, err
	}
	return Load(f)
}
