package nomad

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/operator"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// The plugins' TLS material from Nomad Variables (nomad/*.nomad.hcl with
// tls_from = "variables", docs/security.md): one variable per party,
// tlsVariables/node-<client name> and tlsVariables/controller, items ca,
// cert and key, rendered by the jobs' templates and put in use on SIGHUP
// without a restart.

const tlsVariables = "zfs-nomad/tls"

// putTLSVariable writes the files of a certificate as the variable of
// party name (a client's name, or "controller").
func (e *e2e) putTLSVariable(name string, f tlsconfig.Files) {
	e.t.Helper()
	items := map[string]string{}
	for item, path := range map[string]string{"ca": f.CA, "cert": f.Cert, "key": f.Key} {
		data, err := os.ReadFile(path)
		if err != nil {
			e.t.Fatal(err)
		}
		items[item] = string(data)
	}
	path := tlsVariables + "/node-" + name
	if name == "controller" {
		path = tlsVariables + "/controller"
	}
	body, _ := json.Marshal(map[string]any{"Path": path, "Items": items})
	req, err := http.NewRequest(http.MethodPut, apiAddr+"/v1/var/"+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("PUT /v1/var/%s: %s", path, resp.Status)
	}
	e.show("nomad var put "+path+" ca=@ca.pem cert=@"+filepath.Base(f.Cert)+" key=@"+filepath.Base(f.Key), "")
}

// putTLSVariables issues every client's and the controller's material
// into the Nomad Variables the jobs read, in one command, as
// docs/install.md tells the operator to (zfs-controller tls issue
// -nomad-vars, reaching Nomad through NOMAD_ADDR), from the CA
// makeCertificates made.
func (e *e2e) putTLSVariables() {
	e.t.Helper()
	var clients []string
	for _, n := range e.c.Nodes {
		clients = append(clients, n.ID)
	}
	// The guide's line, with the test's directories and clients, and
	// -nomad-vars, which the guide adds for tls_from = "variables".
	line := guideCommand(e.t, "zfs-controller", "tls", "issue").
		replace(e.t, "/root/zfs-nomad-ca", filepath.Join(e.pki, "ca")).
		replace(e.t, "/root/zfs-nomad-tls", filepath.Join(e.pki, "issued")).
		replace(e.t, "client-1", clients...).replace(e.t, "client-2").replace(e.t, "client-3")
	args := append(line[1:], "-nomad-vars")
	cmd := exec.Command(filepath.Join(e.bin, "zfs-controller"), args...)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+apiAddr)
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("zfs-controller %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	e.show("NOMAD_ADDR="+apiAddr+" zfs-controller "+strings.Join(args, " "), string(out))
}

// renew issues every node and the controller a new certificate valid for
// days from the CA, as an operator renews, and returns their files.
func (e *e2e) renew(days int) map[string]tlsconfig.Files {
	e.t.Helper()
	ctl := filepath.Join(e.bin, "zfs-controller")
	out := map[string]tlsconfig.Files{}
	names := []string{"controller"}
	for _, n := range e.c.Nodes {
		names = append(names, n.ID)
	}
	for _, name := range names {
		role := tlsconfig.RoleNode
		if name == "controller" {
			role = tlsconfig.RoleController
		}
		dir := filepath.Join(e.pki, "renewed", name)
		guesttest.Run(e.t, ctl, "tls", "cert", "-ca", filepath.Join(e.pki, "ca"), "-role", role, "-days", fmt.Sprint(days), "-out", dir, name)
		out[name] = tlsconfig.Files{CA: filepath.Join(e.pki, "ca", "ca.pem"), Cert: filepath.Join(dir, name+".pem"), Key: filepath.Join(dir, name+"-key.pem")}
	}
	return out
}

// expired issues node name a certificate that expired half an hour ago.
func (e *e2e) expired(name string) tlsconfig.Files {
	e.t.Helper()
	ca, err := tlsconfig.OpenCA(filepath.Join(e.pki, "ca"))
	if err != nil {
		e.t.Fatal(err)
	}
	dir := filepath.Join(e.pki, "expired")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		e.t.Fatal(err)
	}
	f, err := ca.IssueInto(dir, name, tlsconfig.RoleNode, -30*time.Minute)
	if err != nil {
		e.t.Fatal(err)
	}
	return f
}

// notAfter reads a certificate file's expiry, as status -json puts it.
func notAfter(e *e2e, path string) string {
	e.t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		e.t.Fatalf("%s holds no PEM", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		e.t.Fatal(err)
	}
	return cert.NotAfter.UTC().Format("2006-01-02T15:04:05Z")
}

// statusReport runs zfs-controller status -json with the operator's
// certificate; its exit status is not the test's business here.
func (e *e2e) statusReport() operator.Report {
	e.t.Helper()
	out, _ := exec.Command(filepath.Join(e.bin, "zfs-controller"), e.operatorArgs("status", "-json")...).Output()
	var r operator.Report
	if err := json.Unmarshal(out, &r); err != nil {
		e.t.Fatalf("status -json: %v\n%s", err, out)
	}
	return r
}

// statusThroughNomad runs zfs-controller status -json as the operator's
// first command after the install guide: no list of agents, only
// NOMAD_ADDR and the operator's certificate in the environment (the line
// tls issue printed), so the agents come from the node job's service in
// Nomad's registry. Every client's agent must be found and answer.
func (e *e2e) statusThroughNomad() {
	e.t.Helper()
	op := e.certificate("operator")
	args := append([]string{"status", "-json"}, agentPortFlags()...)
	e.eventually(time.Minute, "status through Nomad's service registry reaching every agent", func() error {
		cmd := exec.Command(filepath.Join(e.bin, "zfs-controller"), args...)
		cmd.Env = append(os.Environ(), "NOMAD_ADDR="+apiAddr,
			"ZFS_NOMAD_TLS_CA="+op.CA, "ZFS_NOMAD_TLS_CERT="+op.Cert, "ZFS_NOMAD_TLS_KEY="+op.Key)
		out, err := cmd.Output()
		var r operator.Report
		if jsonErr := json.Unmarshal(out, &r); jsonErr != nil {
			return fmt.Errorf("status -json: %v, %v\n%s", err, jsonErr, out)
		}
		if len(r.Nodes) != len(e.c.Nodes) || len(r.Unreachable) != 0 {
			return fmt.Errorf("status found %d agents (want %d), unreachable %v", len(r.Nodes), len(e.c.Nodes), r.Unreachable)
		}
		return nil
	})
	e.tell("zfs-controller status, with only NOMAD_ADDR and the operator's certificate set, found and reached the %d agents through Nomad's service %s", len(e.c.Nodes), "zfs-nomad-agent")
}

// certificatesInUse is each node's certificate expiry as status reports it.
func (e *e2e) certificatesInUse() map[string]string {
	out := map[string]string{}
	for _, n := range e.statusReport().Nodes {
		out[n.Node] = n.CertificateExpires
	}
	return out
}

// taskRuns is every running allocation of the plugin jobs, with its
// task's restarts: "job/node/alloc": "restarts N".
func (e *e2e) taskRuns() map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for job, task := range map[string]string{"zfs-nomad-node": "zfs-node", "zfs-nomad-controller": "zfs-controller"} {
		var allocs []struct {
			ID, NodeName, ClientStatus string
			TaskStates                 map[string]struct{ Restarts int }
		}
		if err := e.get("/v1/job/"+job+"/allocations", &allocs); err != nil {
			e.t.Fatal(err)
		}
		for _, a := range allocs {
			if a.ClientStatus == "running" {
				out[fmt.Sprintf("%s/%s/%.8s", job, a.NodeName, a.ID)] = fmt.Sprintf("restarts %d", a.TaskStates[task].Restarts)
			}
		}
	}
	return out
}

// pluginLog is the log (stderr) of a plugin job's task on node.
func (e *e2e) pluginLog(job, task, node string) string {
	e.t.Helper()
	var allocs []struct{ ID, NodeName, ClientStatus string }
	if err := e.get("/v1/job/"+job+"/allocations", &allocs); err != nil {
		e.t.Fatal(err)
	}
	for _, a := range allocs {
		if a.NodeName == node && a.ClientStatus == "running" {
			out, _ := e.run("alloc", "logs", "-stderr", a.ID, task)
			return out
		}
	}
	e.t.Fatalf("no running allocation of %s on %s", job, node)
	return ""
}

// rotateCertificates renews every node's and the controller's
// certificate by updating their variables while a backup of the counter
// job's volume runs and the job writes to it: the plugins put the new
// ones in use (the templates' SIGHUP) with no restart, the backup ends
// well, no node loses its lease, and the job runs on. Then an expired
// certificate in n2's variable is refused and the one in use kept.
func (e *e2e) rotateCertificates(job allocation) {
	e.t.Helper()
	runs := e.taskRuns()
	// Something for the backup to send while the variables change: 16
	// MiB (the FIGURE below says whether the backup still ran when the
	// new certificates were in use).
	e.nomad("alloc", "exec", "-task", "counter", job.id, "sh", "-c", "head -c 16777216 /dev/urandom > /data/big && sync")
	// A node's lease may have lapsed once while the plugins started
	// (its peers were not up yet), or while the write above was synced
	// (ZFS's I/O threads on both of the guest's CPUs for seconds).
	// Count what the rotation adds, from a moment every node holds its
	// lease: a loss the write caused is logged at the beat after it,
	// which may come after the write ends.
	e.eventually(time.Minute, "every node holding its lease after the write", func() error {
		for _, n := range e.statusReport().Nodes {
			if n.Lease != "held" {
				return fmt.Errorf("node %s: lease %q", n.Node, n.Lease)
			}
		}
		return nil
	})
	leaseLost := map[string]int{}
	for _, n := range e.c.Nodes {
		leaseLost[n.ID] = strings.Count(e.pluginLog("zfs-nomad-node", "zfs-node", n.ID), "lease lost")
	}
	backup, output := e.startOperator("backup", "web-data")
	began := time.Now()
	backupDone := make(chan error, 1)
	go func() { backupDone <- backup.Wait() }()
	renewed := e.renew(30)
	for name, f := range renewed {
		e.putTLSVariable(name, f)
	}
	put := time.Since(began)
	e.eventually(time.Minute, "every node's renewed certificate in use", func() error {
		inUse := e.certificatesInUse()
		for _, n := range e.c.Nodes {
			if want := notAfter(e, renewed[n.ID].Cert); inUse[n.ID] != want {
				return fmt.Errorf("node %s: certificate expiring %s in use, want the renewed one's %s", n.ID, inUse[n.ID], want)
			}
		}
		return nil
	})
	inUse := time.Since(began)
	running := "still running then"
	select {
	case err := <-backupDone:
		backupDone <- err
		running = "already done then"
	default:
	}
	err := <-backupDone
	e.tell("FIGURE certificates rotated through Nomad variables: every node's renewed certificate in use %s after the variables were put, %s after the backup started (%s); the backup took %s",
		(inUse - put).Round(100*time.Millisecond), inUse.Round(100*time.Millisecond), running, time.Since(began).Round(100*time.Millisecond))
	if err != nil || !strings.Contains(output.String(), "done:") {
		e.t.Fatalf("the backup during the rotation: %v\n%s\nthe node plugins' warnings and errors:\n%s", err, output, e.nodeWarnings())
	}
	e.eventually(time.Minute, "every controller instance's renewed certificate in use", func() error {
		for _, node := range e.runningOn("zfs-nomad-controller") {
			if !strings.Contains(e.pluginLog("zfs-nomad-controller", "zfs-controller", node), "TLS material reloaded") {
				return fmt.Errorf("the controller on %s has not logged a reload", node)
			}
		}
		return nil
	})
	if now := e.taskRuns(); fmt.Sprint(now) != fmt.Sprint(runs) {
		e.t.Fatalf("a plugin restarted during the rotation: before %v, after %v", runs, now)
	}
	for _, n := range e.c.Nodes {
		if log := e.pluginLog("zfs-nomad-node", "zfs-node", n.ID); strings.Count(log, "lease lost") != leaseLost[n.ID] {
			e.t.Fatalf("node %s lost its lease during the rotation; its log in the 20 s before:\n%s", n.ID, logBefore(log, "lease lost", leaseLost[n.ID], 20*time.Second))
		}
	}
	if now := e.waitForCounter(""); now.id != job.id {
		e.t.Fatalf("the counter job runs as %s after the rotation, want %s", now.id, job.id)
	}
	e.nomad("alloc", "exec", "-task", "counter", job.id, "rm", "/data/big")

	// An expired certificate is refused; the one in use stays.
	e.putTLSVariable("n2", e.expired("n2"))
	e.eventually(time.Minute, "n2 refusing the expired certificate", func() error {
		log := e.pluginLog("zfs-nomad-node", "zfs-node", "n2")
		if !strings.Contains(log, "new TLS material refused") || !strings.Contains(log, "expired") {
			return fmt.Errorf("n2 has not logged the refusal of its expired certificate")
		}
		return nil
	})
	if inUse, want := e.certificatesInUse()["n2"], notAfter(e, renewed["n2"].Cert); inUse != want {
		e.t.Fatalf("n2 uses a certificate expiring %s after the expired one was refused, want the renewed one's %s", inUse, want)
	}
	e.putTLSVariable("n2", renewed["n2"])
}

// nodeWarnings is every node plugin's WARN and ERROR lines, by node:
// what explains why an operator command found no node answering.
func (e *e2e) nodeWarnings() string {
	var b strings.Builder
	for _, n := range e.c.Nodes {
		fmt.Fprintf(&b, "-- %s:\n%s\n", n.ID, warnings(e.pluginLog("zfs-nomad-node", "zfs-node", n.ID)))
	}
	return b.String()
}

// startOperator starts a zfs-controller operator command, as operator
// does, and returns it running and where its output goes.
func (e *e2e) startOperator(command string, args ...string) (*exec.Cmd, *strings.Builder) {
	e.t.Helper()
	cmd := exec.Command(filepath.Join(e.bin, "zfs-controller"), e.operatorArgs(command, args...)...)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	return cmd, out
}

// logBefore returns the lines of a plugin log from span before the
// (skip+1)-th line containing marker to that line: what the plugin did
// while it went wrong, the line the failure found included. Lines
// without a timestamp of their own belong to the one above.
func logBefore(log, marker string, skip int, span time.Duration) string {
	lines := strings.Split(log, "\n")
	at := -1
	for i, line := range lines {
		if strings.Contains(line, marker) {
			if skip == 0 {
				at = i
				break
			}
			skip--
		}
	}
	if at < 0 {
		return warnings(log)
	}
	end, ok := logTime(lines[at])
	if !ok {
		return lines[at]
	}
	first := at
	for first > 0 {
		if t, ok := logTime(lines[first-1]); ok && end.Sub(t) > span {
			break
		}
		first--
	}
	return strings.Join(lines[first:at+1], "\n")
}

// logTime reads the timestamp an hclog line starts with.
func logTime(line string) (time.Time, bool) {
	field, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	t, err := time.Parse("2006-01-02T15:04:05.000Z0700", field)
	return t, err == nil
}

// warnings returns a plugin log's WARN and ERROR lines: what explains a
// failure, short enough that a CI excerpt keeps it.
func warnings(log string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "[WARN]") || strings.Contains(line, "[ERROR]") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestLogBefore: the lines up to a marker's chosen occurrence, from span
// before it, continuation lines kept with their line.
func TestLogBefore(t *testing.T) {
	log := strings.Join([]string{
		"2026-12-04T20:42:40.000Z [DEBUG] zfs-node.agent: call: long before",
		"2026-12-04T20:42:55.000Z [WARN]  zfs-node.lease: lease lost: the first",
		"2026-12-04T20:43:00.000Z [DEBUG] zfs-node.agent: call: within",
		"  a continuation line",
		"2026-12-04T20:43:13.000Z [WARN]  zfs-node.lease: lease lost: the second",
		"2026-12-04T20:43:14.000Z [INFO]  zfs-node: after",
	}, "\n")
	for _, tc := range []struct {
		skip int
		want string
	}{
		{0, "2026-12-04T20:42:40.000Z [DEBUG] zfs-node.agent: call: long before\n2026-12-04T20:42:55.000Z [WARN]  zfs-node.lease: lease lost: the first"},
		{1, "2026-12-04T20:42:55.000Z [WARN]  zfs-node.lease: lease lost: the first\n2026-12-04T20:43:00.000Z [DEBUG] zfs-node.agent: call: within\n  a continuation line\n2026-12-04T20:43:13.000Z [WARN]  zfs-node.lease: lease lost: the second"},
	} {
		if got := logBefore(log, "lease lost", tc.skip, 20*time.Second); got != tc.want {
			t.Errorf("skip %d:\n%s\nwant\n%s", tc.skip, got, tc.want)
		}
	}
}
