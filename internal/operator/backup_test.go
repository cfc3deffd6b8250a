package operator

import (
	"context"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// TestBackupTarget: a backup without -to goes where the schedule would
// put the volume's replica: a node that holds one, else the one with most
// room. The nodes' room must be asked for: placing over nodes asked
// without it found no node with room whenever no replica existed yet
// (test/nomad's backup failed so, depending on whether the schedule had
// pushed first).
func TestBackupTarget(t *testing.T) {
	tests := []struct {
		name      string
		available map[string]uint64
		replicaOn string // the node holding a replica of the volume, if any
		want      string
	}{
		{"no replica yet: the node with most room", map[string]uint64{"n1": 5 << 30, "n2": 1 << 30, "n3": 3 << 30}, "", "n3"},
		{"the node that holds a replica", map[string]uint64{"n1": 5 << 30, "n2": 1 << 30, "n3": 3 << 30}, "n2", "n2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fakes clustertest.Fakes
			for _, id := range []string{"n1", "n2", "n3"} {
				agent := fakes.Add(agentclient.NodeInfo{NodeID: id, AvailableBytes: tt.available[id], MaxVolumes: 100})
				if id == tt.replicaOn {
					agent.PutReplica("backed-up", 1)
				}
			}
			cl := fakes.Cluster(t)
			nodes, _, err := cl.Nodes(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var src cluster.Node
			for _, n := range nodes {
				if n.Info.NodeID == "n1" {
					src = n
				}
			}
			got, err := pickTarget(context.Background(), cl, src, agentclient.Volume{VolumeID: vocab.VolumeIDForName("backed-up"), UsedBytes: 8 << 20}, "")
			if err != nil {
				t.Fatalf("no target: %v", err)
			}
			if got.Info.NodeID != tt.want {
				t.Errorf("backup goes to %s, want %s", got.Info.NodeID, tt.want)
			}
		})
	}
}
