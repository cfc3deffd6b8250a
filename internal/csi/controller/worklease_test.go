package controller

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/worklease"
)

// TestOneControllerInstanceHoldsTheWorkLease runs two controller
// instances' holders against real agent servers over gRPC: one holds the
// work lease, every node names it to the other and lists both, and the
// other takes over once the holder releases it (the grants' running out
// is TestGrants's).
func TestOneControllerInstanceHoldsTheWorkLease(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
	for _, srv := range tc.servers {
		srv.WorkLease = worklease.NewGrantsAtOnce(time.Now)
	}
	ctx := context.Background()
	holder := func(id string) *worklease.Holder {
		c := tc.agents.Cluster(t)
		return worklease.NewHolder(worklease.Instance{ID: id, Host: "host-" + id, Address: "10.0.0.1:9100", Started: time.Now(), NomadAlloc: "alloc-" + id},
			cluster.WorkLeaseAsker(c), hclog.NewNullLogger())
	}
	a, b := holder("ctl-a"), holder("ctl-b")
	a.Try(ctx)
	b.Try(ctx)
	if _, ok := a.Held(); !ok {
		t.Fatal("the first instance to ask does not hold the lease")
	}
	if _, ok := b.Held(); ok {
		t.Fatal("both instances hold the lease")
	}
	l, _, err := tc.agents.Cluster(t).Nodes(ctx)
	if err != nil || len(l) != 3 {
		t.Fatalf("nodes: %v %v", l, err)
	}
	for _, n := range l {
		got, err := n.Agent.WorkLeases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got.Holder.ID != "ctl-a" || got.Holder.Host != "host-ctl-a" || got.Holder.Address != "10.0.0.1:9100" || got.Holder.NomadAlloc != "alloc-ctl-a" || got.HolderSince.IsZero() || len(got.Seen) != 2 {
			t.Fatalf("node %s tells %+v", n.Info.NodeID, got)
		}
	}

	a.Release()
	b.Try(ctx)
	if _, ok := b.Held(); !ok {
		t.Fatal("the other instance did not take over after a release")
	}

	// With a node down, the other two still make a majority.
	tc.stop("n3")
	b.Try(ctx)
	if _, ok := b.Held(); !ok {
		t.Fatal("two of three nodes renewed, yet not held")
	}
	a.Try(ctx)
	if _, ok := a.Held(); ok {
		t.Fatal("both instances hold the lease")
	}
}
