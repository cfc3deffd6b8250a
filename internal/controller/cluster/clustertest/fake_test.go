package clustertest

import (
	"context"
	"errors"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

func TestFakesMakeACluster(t *testing.T) {
	var fakes Fakes
	n1 := fakes.Add(agentclient.NodeInfo{NodeID: "n1"})
	n2 := fakes.Add(agentclient.NodeInfo{NodeID: "n2"})
	id := n1.PutPrimary("v", 3)
	c := fakes.Cluster(t, "gone:7670")
	ctx := context.Background()

	nodes, unreachable, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 2 || len(unreachable) != 1 || nodes[0].Info.Volumes != 1 {
		t.Fatalf("Nodes: %d nodes (%+v), %d unreachable, %v; want 2 (n1 holding one volume) and 1", len(nodes), nodes, len(unreachable), err)
	}
	get := func(ctx context.Context, a cluster.Agent) (agentclient.Volume, error) { return a.GetVolume(ctx, id) }
	found, err := cluster.Find(ctx, c, "volume "+id, get)
	if err != nil || found.Node.Info.NodeID != "n1" || found.Object.Generation != 3 {
		t.Fatalf("Find: %+v, %v; want generation 3 on n1", found, err)
	}

	// A node that is down is unreachable: it may hold the volume.
	n2.SetDown(true)
	n1.Refuse("GetVolume", errdefs.Wrap(errdefs.ErrNotFound, "gone"))
	if _, err := cluster.Find(ctx, c, "volume "+id, get); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Find with a node down: %v, want Unavailable", err)
	}
}
