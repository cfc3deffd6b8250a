package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
)

// TestCommandLine: the command line answers a person at a terminal as
// zrepl's and Nomad's do: a list of commands, each command's own usage,
// and exit status 2 for a wrong command line.
func TestCommandLine(t *testing.T) {
	noEnv := func(string) string { return "" }
	t.Setenv("NOMAD_ADDR", "http://127.0.0.1:1") // nothing listens there
	tests := []struct {
		args     string
		code     int
		errorHas string
	}{
		{"", 2, "no command given"},
		{"-h", 0, ""},
		{"help", 0, ""},
		{"help status", 0, ""},
		{"backup -h", 0, ""},
		{"version", 0, ""},
		{"bogus", 2, `unknown command "bogus"`},
		{"backup -peers a:1 -insecure-agent-port", 2, "want one VOLUME"},
		{"backup -peers a:1 -insecure-agent-port vol-1 vol-2", 2, "want one VOLUME (its name or ID), got 2"},
		{"status -peers a:1 -insecure-agent-port stray", 2, "status takes no arguments"},
		{"status -placement most-free", 2, "-placement"},
		{"remove-replica -peers a:1 -insecure-agent-port vol-1", 2, "-node is required"},
		{"-peers a:1 -insecure-agent-port stray", 2, `unexpected argument "stray"`},
		{"backup vol-1", 1, "tls"}, // a configuration error, not a wrong command line
		// No peers: the agents are asked of Nomad, which does not answer.
		{"backup -insecure-agent-port vol-1", 1, "finding the node agents through Nomad failed"},
		{"backup -insecure-agent-port -nomad-service= vol-1", 1, "peers, peers_file or nomad_service"},
		{"tls", 2, "needs ca, cert or issue"},
		{"tls bogus", 2, `unknown tls command "bogus"`},
		{"tls ca", 2, "want one DIR"},
		{"tls ca -days 0 /nonexistent/x", 2, "-days 0"},
		{"tls cert -ca /nonexistent client-1", 2, "-role is required"},
		{"tls cert -role node client-1", 2, "-ca is required"},
		{"tls cert -ca /nonexistent -role nod client-1", 2, `-role "nod": want node, controller, operator or backup`},
		{"tls cert -ca /nonexistent -role node client-1", 1, "no such file"},
		{"tls cert -h", 0, ""},
		{"tls issue -h", 0, ""},
		{"tls issue -ca /nonexistent", 2, "want at least one CLIENT"},
		{"tls issue client-1", 2, "-ca is required"},
		{"tls issue -ca /nonexistent -days 0 client-1", 2, "-days 0"},
		{"tls issue -ca /nonexistent -stagger-days -1 client-1", 2, "-stagger-days -1"},
		{"tls cert client-1 -ca /nonexistent -role nod", 2, `-role "nod"`}, // flags after the argument
	}
	for _, tc := range tests {
		t.Run(tc.args, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := run(strings.Fields(tc.args), noEnv, &stdout, &stderr)
			if code != tc.code || !strings.Contains(stderr.String(), tc.errorHas) {
				t.Errorf("zfs-controller %s: exit %d, stderr %q; want exit %d and an error naming %q", tc.args, code, stderr.String(), tc.code, tc.errorHas)
			}
		})
	}
}

// TestHelp: -h anywhere on a command's line, help COMMAND and a nested
// command's -h print that command's usage and its flags on stdout.
func TestHelp(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, tc := range []struct{ args, want string }{
		{"-h", "Commands:"},
		{"help", "remove-replica"},
		{"help promote", "-force"},
		{"promote web-data -h", "usage: zfs-controller promote"},
		{"promote -h web-data", "-node string"},
		{"tls -h", "issue"},
		{"tls issue -h", "-stagger-days"},
		{"tls cert vol -h", "-role string"},
		{"serve -h", "-csi-endpoint"},
		{"version -h", "usage: zfs-controller version"},
	} {
		var stdout, stderr strings.Builder
		if code := run(strings.Fields(tc.args), noEnv, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), tc.want) {
			t.Errorf("zfs-controller %s: exit %d, stdout %q, stderr %q; want exit 0 and %q on stdout", tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
}

// TestCompletion: with COMP_LINE set, as a shell's completion calls it,
// the binary prints the words that complete the line: commands, nested
// commands and each command's flags.
func TestCompletion(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"zfs-controller pro", []string{"promote"}},
		{"zfs-controller tls ", []string{"ca", "cert", "issue"}},
		{"zfs-controller promote -fo", []string{"-force"}},
		{"zfs-controller tls issue -stag", []string{"-stagger-days"}},
		{"zfs-controller status -tls-c", []string{"-tls-ca", "-tls-cert"}},
	} {
		got := completions(t, tc.line)
		if !slices.Equal(got, tc.want) {
			t.Errorf("completing %q: %q, want %q", tc.line, got, tc.want)
		}
	}
}

// completions runs the command line as a shell's completion does and
// returns the words printed, sorted. The library prints them on the
// process's stdout.
func completions(t *testing.T, line string) []string {
	t.Helper()
	t.Setenv("COMP_LINE", line)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	code := run(nil, os.Getenv, io.Discard, io.Discard)
	os.Stdout = stdout
	w.Close()
	out, _ := io.ReadAll(r)
	if code != 0 {
		t.Fatalf("completing %q: exit %d", line, code)
	}
	words := strings.Fields(string(out))
	slices.Sort(words)
	return words
}

// TestTLSCommands: a CA, then a node's certificate from it, as
// docs/install.md tells an operator; the files load as the agent port's
// TLS material.
func TestTLSCommands(t *testing.T) {
	dir := t.TempDir()
	noEnv := func(string) string { return "" }
	ca, out := filepath.Join(dir, "ca"), filepath.Join(dir, "client-1")
	for _, args := range [][]string{
		{"tls", "ca", ca},
		{"tls", "cert", "-ca", ca, "-role", "node", "-days", "90", "-out", out, "client-1"},
	} {
		var stderr strings.Builder
		if code := run(args, noEnv, io.Discard, &stderr); code != 0 {
			t.Fatalf("zfs-controller %s: exit %d, %s", strings.Join(args, " "), code, stderr.String())
		}
	}
	var stderr strings.Builder
	if code := run([]string{"tls", "ca", ca}, noEnv, io.Discard, &stderr); code != 1 || !strings.Contains(stderr.String(), "already exists") {
		t.Errorf("a second CA over the first: exit %d, %s; want refused", code, stderr.String())
	}
	files := tlsconfig.Files{CA: filepath.Join(ca, "ca.pem"), Cert: filepath.Join(out, "client-1.pem"), Key: filepath.Join(out, "client-1-key.pem")}
	if _, err := tlsconfig.Load(files); err != nil {
		t.Errorf("the issued files do not load: %v", err)
	}
}

// TestTLSIssue: one command makes what install.md's third step needs: a
// CA, each client's /etc/zfs-nomad (its node certificate under the names
// the plugins read, the controller's) and an operator's, each loading as
// its party's material; with -nomad-vars each client's and the
// controller's reach Nomad's variables API at the paths the jobs read. A
// second run renews from the same CA.
func TestTLSIssue(t *testing.T) {
	dir := t.TempDir()
	puts := map[string]map[string]string{}
	nomad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v struct{ Items map[string]string }
		if err := json.NewDecoder(r.Body).Decode(&v); err != nil {
			t.Errorf("%s: %v", r.URL.Path, err)
		}
		puts[r.URL.Path] = v.Items
	}))
	defer nomad.Close()
	env := map[string]string{"NOMAD_ADDR": nomad.URL}
	ca, out := filepath.Join(dir, "ca"), filepath.Join(dir, "out")
	args := []string{"-ca", ca, "-out", out, "client-1", "client-2", "-nomad-vars"}
	if err := tlsIssue(args, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	for _, client := range []string{"client-1", "client-2"} {
		etc := filepath.Join(out, client)
		node := tlsconfig.Files{CA: filepath.Join(etc, "ca.pem"), Cert: filepath.Join(etc, "node.pem"), Key: filepath.Join(etc, "node-key.pem")}
		ctl := tlsconfig.Files{CA: node.CA, Cert: filepath.Join(etc, "controller.pem"), Key: filepath.Join(etc, "controller-key.pem")}
		wantParty(t, node, tlsconfig.RoleNode, client)
		wantParty(t, ctl, tlsconfig.RoleController, "controller")
		if items := puts["/v1/var/zfs-nomad/tls/node-"+client]; items["cert"] != readFile(t, node.Cert) || items["key"] != readFile(t, node.Key) || items["ca"] != readFile(t, node.CA) {
			t.Errorf("Nomad variable of %s: %v", client, items)
		}
	}
	if items := puts["/v1/var/zfs-nomad/tls/controller"]; items["cert"] != readFile(t, filepath.Join(out, "controller", "controller.pem")) {
		t.Errorf("Nomad variable of the controller: %v", items)
	}
	if len(puts) != 3 {
		t.Errorf("variables put: %v, want two clients' and the controller's", puts)
	}
	op := filepath.Join(out, "operator")
	wantParty(t, tlsconfig.Files{CA: filepath.Join(op, "ca.pem"), Cert: filepath.Join(op, "operator.pem"), Key: filepath.Join(op, "operator-key.pem")}, tlsconfig.RoleOperator, "operator")
	// The clients' expiries are spread over -stagger-days (30) after the
	// controller's: client i of n at i*30/n days.
	ctlExpiry := notAfter(t, filepath.Join(out, "controller", "controller.pem"))
	for i, client := range []string{"client-1", "client-2"} {
		got := notAfter(t, filepath.Join(out, client, "node.pem")).Sub(ctlExpiry)
		if want := time.Duration(i*15) * 24 * time.Hour; got < want-time.Minute || got > want+time.Minute {
			t.Errorf("%s expires %v after the controller, want %v", client, got, want)
		}
	}

	before := readFile(t, filepath.Join(out, "client-1", "node.pem"))
	caBefore := readFile(t, filepath.Join(ca, "ca.pem"))
	if err := tlsIssue([]string{"-ca", ca, "-out", out, "client-1"}, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	if readFile(t, filepath.Join(out, "client-1", "node.pem")) == before || readFile(t, filepath.Join(ca, "ca.pem")) != caBefore {
		t.Error("a second run did not renew client-1's certificate from the same CA")
	}
}

// wantParty checks that f loads and names name with role.
func wantParty(t *testing.T, f tlsconfig.Files, role, name string) {
	t.Helper()
	if _, err := tlsconfig.Load(f); err != nil {
		t.Fatalf("%s's files do not load: %v", name, err)
	}
	block, _ := pem.Decode([]byte(readFile(t, f.Cert)))
	if block == nil {
		t.Fatalf("%s: no PEM", f.Cert)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != name || len(cert.Subject.OrganizationalUnit) != 1 || cert.Subject.OrganizationalUnit[0] != role {
		t.Errorf("%s names %s %v, want %s of role %s", f.Cert, cert.Subject.CommonName, cert.Subject.OrganizationalUnit, name, role)
	}
}

// notAfter is the expiry of the certificate in path.
func notAfter(t *testing.T, path string) time.Time {
	t.Helper()
	block, _ := pem.Decode([]byte(readFile(t, path)))
	if block == nil {
		t.Fatalf("%s: no PEM", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert.NotAfter
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestConnectReturnsTheVolume(t *testing.T) {
	sess, err := connect(commands[1], []string{"-peers", "a:1", "-insecure-agent-port", "-to", "n2", "vol-1"}, "VOLUME", nil)
	if err == nil {
		defer sess.nodes.Close()
	}
	if err == nil || sess.arg != "" {
		// -to is backup's own flag: connect alone does not know it.
		t.Fatalf("connect without backup's flags: %q, %v; want the unknown -to refused", sess.arg, err)
	}
	// No node answers: an ID is taken as it is (the command says what it
	// finds), a name is not found.
	id := contract.VolumeIDForName("data")
	for arg, want := range map[string]string{id: id, "data": ""} {
		sess, err = connect(commands[1], []string{"-peers", "a:1", "-insecure-agent-port", arg}, "VOLUME", nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := sess.volume(context.Background())
		sess.nodes.Close()
		if got != want || (want == "" && (err == nil || !strings.Contains(err.Error(), `no volume named "data"`))) {
			t.Errorf("volume %s: %q, %v; want %q", arg, got, err, want)
		}
	}
}
