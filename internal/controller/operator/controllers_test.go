package operator

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// TestStatusShowsTheControllerInstances: two instances asked the nodes
// for the work lease; status names both, the holder with since when and
// which nodes grant it, the other on standby.
func TestStatusShowsTheControllerInstances(t *testing.T) {
	var fakes clustertest.Fakes
	for _, id := range []string{"n1", "n2", "n3"} {
		fakes.Add(agentclient.NodeInfo{NodeID: id})
	}
	cl := fakes.Cluster(t)
	ctx := context.Background()
	started := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, id := range []string{"ctl-a", "ctl-b"} {
		h := worklease.NewHolder(worklease.Instance{ID: id, Host: "host-" + id, Address: "10.0.0.9:9100", Version: "v9", Started: started,
			NomadAlloc: "5b1e3f0a-" + id},
			cluster.WorkLeaseAsker(cl), hclog.NewNullLogger())
		h.Try(ctx)
	}
	r, err := Status(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Controllers) != 2 {
		t.Fatalf("controllers: %+v, want two", r.Controllers)
	}
	a, b := r.Controllers[0], r.Controllers[1]
	if a.ID != "ctl-a" || !a.HoldsWorkLease || strings.Join(a.GrantedBy, ",") != "n1,n2,n3" || a.HolderSince.IsZero() ||
		a.Host != "host-ctl-a" || a.Version != "v9" || !a.Started.Equal(started) || a.LastSeen.IsZero() {
		t.Errorf("the holder: %+v", a)
	}
	if b.ID != "ctl-b" || b.HoldsWorkLease || len(b.GrantedBy) != 0 || !b.HolderSince.IsZero() {
		t.Errorf("the standby: %+v", b)
	}
	var out strings.Builder
	PrintStatus(&out, r, time.Now())
	for _, want := range []string{
		`CONTROLLER +HOST +ADDRESS +DRIVER +STARTED +WORK LEASE`,
		`ctl-a +host-ctl-a \(alloc 5b1e3f0a\) +10\.0\.0\.9:9100 +v9 +1h0m\d+s ago +HOLDS it since \d\d:\d\d:\d\d \(\ds ago\), granted by n1,n2,n3`,
		`ctl-b +host-ctl-b .* standby \(asked \ds ago\)`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}

	// Nobody asked: said in one line.
	out.Reset()
	printControllers(&out, nil, time.Now())
	if !strings.Contains(out.String(), "none asked the nodes for the work lease lately") {
		t.Errorf("no instance: %s", out.String())
	}
	// One node's grant alone is no holding.
	out.Reset()
	printControllers(&out, []ControllerStatus{{ID: "ctl-c", GrantedBy: []string{"n1"}, LastSeen: time.Now()}}, time.Now())
	if !strings.Contains(out.String(), "granted by n1 only, not a majority") || !strings.Contains(out.String(), "no instance holds the work lease now") {
		t.Errorf("a minority's grant: %s", out.String())
	}
}
