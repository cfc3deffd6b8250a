package migration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/operator"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// TestARetiredNodeCountsNoMore (docs/operations.md, "Retiring"; docs/
// safety.md, "Retiring a node"): n3's plugin stops; retire-node refuses
// while the list still names n3's agent (a node that did not answer
// keeps counting it) and while n1 and n2 heard n3 within L+M; then the
// nodes left count two nodes, without a restart, and hold their leases.
// n3's plugin started again by mistake is refused by both and never
// holds its lease, so its primaries stay read-only.
func TestARetiredNodeCountsNoMore(t *testing.T) {
	t.Parallel()
	c := guesttest.StartCluster(t, 3, guestcluster.Options{ControllerArgs: explicitPushes(),
		Lease: failoverLease, NodeArgs: []string{"-lease-margin=" + failoverMargin.String()}})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	ctl := filepath.Join(guesttest.BinDir(t), "zfs-controller")
	tlsArgs := []string{"-agent-timeout", "10s", "-tls-ca", c.Operator.CA, "-tls-cert", c.Operator.Cert, "-tls-key", c.Operator.Key}
	all := append([]string{"-peers", strings.Join(c.AgentAddresses(), ",")}, tlsArgs...)
	left := append([]string{"-peers", n1.AgentAddress + "," + n2.AgentAddress}, tlsArgs...)
	retire := func(args []string) (string, error) {
		out, err := exec.Command(ctl, append(append([]string{"retire-node"}, args...), "n3")...).CombinedOutput()
		return string(out), err
	}

	if out, err := retire(all); err == nil || !strings.Contains(out, "n3 still answers") {
		t.Fatalf("retire-node of a running n3: %v\n%s", err, out)
	}
	n3.Kill()
	stopped := time.Now()
	if out, err := retire(all); err == nil || !strings.Contains(out, "did not answer") {
		t.Fatalf("retire-node while the list still names n3's agent: %v\n%s", err, out)
	}
	if out, err := retire(left); err == nil || !strings.Contains(out, "heard from n3") {
		t.Fatalf("retire-node right after n3 stopped: %v, want each node's refusal until L+M\n%s", err, out)
	}
	time.Sleep(time.Until(stopped.Add(failoverLease + failoverMargin + time.Second)))
	out, err := retire(left)
	if err != nil || !strings.Contains(out, "n1 no longer counts n3: its lease counts 2 nodes") || !strings.Contains(out, "n2 no longer counts n3: its lease counts 2 nodes") {
		t.Fatalf("retire-node after L+M: %v\n%s", err, out)
	}
	jsonOut, err := exec.Command(ctl, append([]string{"status", "-json"}, left...)...).Output()
	var report operator.Report
	if err == nil {
		err = json.Unmarshal(jsonOut, &report)
	}
	if err != nil {
		t.Fatalf("status -json: %v\n%s", err, jsonOut)
	}
	for _, n := range report.Nodes {
		if n.KnownNodes != 2 || !slices.Equal(n.RetiredNodes, []string{"n3"}) || n.Lease != "held" {
			t.Errorf("status of %s: counts %d nodes, retired %v, lease %q; want 2, [n3], held", n.Node, n.KnownNodes, n.RetiredNodes, n.Lease)
		}
	}

	// n3 back by mistake: refused by both, it never holds its lease.
	if err := n3.Start(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(2 * failoverLease); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if v, err := n3.Metric("zfs_nomad_lease_held"); err == nil && v == "1" {
			t.Fatal("the retired n3, started again, holds its lease")
		}
	}
	for _, n := range []*guestcluster.Node{n1, n2} {
		if v, err := n.Metric("zfs_nomad_lease_held"); err != nil || v != "1" {
			t.Errorf("%s's lease with n3 retired and back: %q, %v; want held", n.ID, v, err)
		}
	}
	log, err := os.ReadFile(n3.Process.Log)
	if err != nil || !strings.Contains(string(log), "was retired on node n1") && !strings.Contains(string(log), "was retired on node n2") {
		t.Errorf("n3's log does not say why its peers refuse it (%v):\n%s", err, log)
	}
}
