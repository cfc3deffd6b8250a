package migration

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
)

// TestSelfFenceOfTwentyPrimaries, on real ZFS: a node with 20 mounted
// primaries is cut off from its peers; the self-fence makes all 20
// read-only (writes fail with EROFS) within the bound docs/safety.md
// states ("Why the margin covers the self-fence"): within the fence
// allowance F (config.FenceAllowance) of the beat that notices the lost
// lease, so within L + L/4 + F of the cut. The figures are logged: the
// cut to the node's "lease lost" line, that line to the last volume's
// read-only line, and the cut to the moment no write succeeds.
func TestSelfFenceOfTwentyPrimaries(t *testing.T) {
	const lease, margin, volumes = 8 * time.Second, 19 * time.Second, 20
	e := startWithLease(t, lease, "-lease-margin="+margin.String())
	n1 := e.node("n1")
	var dirs []string
	for i := range volumes {
		id := e.create(fmt.Sprintf("fenced-%02d", i), nil)
		dirs = append(dirs, e.mustPublish(id, "n1"))
	}
	// writable counts the volumes on n1 that still take a write.
	probe := "n=0; for d in " + strings.Join(dirs, " ") + "; do if { echo x > $d/probe; } 2>/dev/null; then n=$((n+1)); fi; done; echo $n"
	writable := func() int {
		out, err := n1.Exec(probe)
		if err != nil {
			t.Fatalf("probing n1's volumes: %v", err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("probing n1's volumes: %q", out)
		}
		return n
	}
	if n := writable(); n != volumes {
		t.Fatalf("%d of %d volumes take writes before the cut", n, volumes)
	}

	if err := n1.CutLink(); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	bound := lease + lease/4 + config.FenceAllowance
	var last int
	for last = writable(); last > 0 && time.Since(cut) < 2*bound; last = writable() {
		time.Sleep(100 * time.Millisecond)
	}
	allReadOnly := time.Since(cut)
	if last > 0 {
		t.Fatalf("%d of %d volumes still took writes %s after n1's link was cut (bound %s)", last, volumes, allReadOnly.Round(time.Millisecond), bound)
	}
	// Every one refuses a write with EROFS, not some other error.
	out, _ := n1.Exec("for d in " + strings.Join(dirs, " ") + "; do echo x > $d/after 2>&1; done")
	if got := strings.Count(out, "Read-only file system"); got != volumes {
		t.Errorf("writes after the self-fence: %d of %d failed with EROFS:\n%s", got, volumes, out)
	}

	lost, fenced := fenceTimes(t, n1, cut)
	if len(fenced) != volumes {
		t.Errorf("n1 logged %d volumes made read-only after the cut, want %d", len(fenced), volumes)
	}
	var first, span time.Duration
	if len(fenced) > 0 {
		first, span = fenced[0].Sub(lost), fenced[len(fenced)-1].Sub(lost)
	}
	t.Logf("lease %s, margin %s, %d mounted primaries: lease lost %.1f s after the cut; the self-fence took %.2f s from that line to the last volume's (first %.2f s); no write succeeded %.1f s after the cut (bound %s)",
		lease, margin, volumes, lost.Sub(cut).Seconds(), span.Seconds(), first.Seconds(), allReadOnly.Seconds(), bound)
	if span > config.FenceAllowance {
		t.Errorf("the self-fence of %d primaries took %s after the lease was lost, more than the fence allowance %s", volumes, span, config.FenceAllowance)
	}
	if allReadOnly > bound {
		t.Errorf("the last volume turned read-only %s after the cut, more than L + L/4 + F = %s", allReadOnly, bound)
	}
}

// fenceTimes reads n's log: when it logged that it lost its lease after
// since, and when it made each volume read-only after that, in order.
func fenceTimes(t *testing.T, n *guestcluster.Node, since time.Time) (lost time.Time, fenced []time.Time) {
	t.Helper()
	data, err := os.ReadFile(n.Process.Log)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		stamp, _, _ := strings.Cut(line, " ")
		at, err := time.Parse("2006-01-02T15:04:05.000Z0700", stamp)
		if err != nil || at.Before(since.Add(-time.Second)) {
			continue
		}
		switch {
		case strings.Contains(line, "lease lost: no majority") && lost.IsZero():
			lost = at
		case strings.Contains(line, "lease lost: volume made read-only") && !lost.IsZero():
			fenced = append(fenced, at)
		}
	}
	if lost.IsZero() {
		t.Fatalf("n1's log has no \"lease lost\" line after the cut at %s", since.Format(time.StampMilli))
	}
	return lost, fenced
}
