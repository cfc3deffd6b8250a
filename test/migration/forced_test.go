package migration

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// TestAForcedPrimaryIsUnderTheLeaseOnceTheMajorityReturns: five nodes
// that keep leases. The primary's node n1 is lost and n4 and n5 are cut
// off: with only n2 and n3 answering, the operator promotes n2's replica
// with promote -force, and the job writes there. n4 and n5 come back, a
// replica is pushed to n3, and then n2 is cut off from everyone: the
// majority may fail the volume over after the lease and its margin, so
// n2's mount must turn read-only within about a lease, as any primary's,
// and stay so once its link is back. Before, the forced copy stayed
// exempt from the self-fence for as long as it kept its generation, and
// took writes beside the failover's copy.
func TestAForcedPrimaryIsUnderTheLeaseOnceTheMajorityReturns(t *testing.T) {
	c := guesttest.StartCluster(t, 5, guestcluster.Options{ControllerArgs: explicitPushes(),
		Lease: failoverLease, NodeArgs: []string{"-lease-margin=" + failoverMargin.String()}})
	e := &env{t: t, c: c, ctx: context.Background()}
	id, dir := e.createWritten("forced", map[string]string{"failover": "auto"}, "echo before > a")
	e.replicate(id, "n1", "n2")
	e.unpublish(id, "n1")
	e.loseNode("n1")
	for _, n := range []string{"n4", "n5"} {
		if err := e.node(n).CutLink(); err != nil {
			t.Fatal(err)
		}
	}
	ctl := filepath.Join(guesttest.BinDir(t), "zfs-controller")
	out := guesttest.Run(t, ctl, "promote", "-peers", strings.Join(e.c.AgentAddresses(), ","), "-agent-timeout", "10s",
		"-tls-ca", e.c.Operator.CA, "-tls-cert", e.c.Operator.Cert, "-tls-key", e.c.Operator.Key, "-node", "n2", "-force", id)
	if !strings.Contains(out, "node n2 is the primary now") || !strings.Contains(out, "declared lost") {
		t.Fatalf("promote -force with n2 and n3 of five answering (and what the operator must do): %s", out)
	}
	dir = e.mustPublish(id, "n2")
	probe := func() error { return e.tryWrite("n2", dir) }
	if err := probe(); err != nil {
		t.Fatalf("a write on the forced copy while no majority answers: %v", err)
	}

	for _, n := range []string{"n4", "n5"} {
		if err := e.node(n).RestoreLink(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 4*failoverLease, "n2's forced mark to end with the majority back", func() bool {
		return e.copyOn(id, "n2").GetForcedGeneration() == 0
	})
	e.replicate(id, "n2", "n3")

	cut := e.cutOffWhenLeased("n2", failoverLease, probe)
	waitFor(t, 3*failoverLease, "writes on the once-forced n2 to fail after its link was cut", func() bool { return probe() != nil })
	t.Logf("FIGURE the once-forced primary read-only %.1f s after its link was cut (lease %s)", time.Since(cut).Seconds(), failoverLease)
	e.publishAfterSilence(id, "n3")
	if err := e.node("n2").RestoreLink(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(failoverLease) // a few beats with its peers answering
	if err := probe(); err == nil {
		t.Fatal("n2's copy took a write after the failover to n3 and its link's return")
	}
	// n1, lost for good, still holds its unmounted copy of generation 1
	// as it was: it is set aside when it returns.
	if w := e.writablePrimaries(id); !slices.Contains(w, "n3") || slices.Contains(w, "n2") {
		t.Fatalf("writable primaries after the failover and n2's return: %v, want n3's and not n2's", w)
	}
}
