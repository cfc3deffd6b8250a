package operator

import (
	"context"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/cluster/clustertest"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// agent is a node agent that reports its room and the replicas it holds,
// answering GetNode as a real one does: without the room when asked
// without capacity.
type agent struct {
	pb.UnimplementedNodeAgentServer
	id        string
	available uint64
	replicas  []string // volume IDs
}

func (a *agent) GetNode(_ context.Context, r *pb.GetNodeRequest) (*pb.Node, error) {
	n := &pb.Node{NodeId: a.id, MaxQuotaBytes: 10 << 30, MaxVolumes: 100}
	if !r.GetWithoutCapacity() {
		n.AvailableBytes = a.available
	}
	return n, nil
}

func (a *agent) Status(context.Context, *pb.StatusRequest) (*pb.NodeStatus, error) {
	st := &pb.NodeStatus{}
	for _, id := range a.replicas {
		st.Replicas = append(st.Replicas, &pb.Replica{VolumeId: id})
	}
	return st, nil
}

// TestBackupTarget: a backup without -to goes where the schedule would
// put the volume's replica: a node that holds one, else the one with most
// room. The nodes' room must be asked for: placing over nodes asked
// without it found no node with room whenever no replica existed yet
// (test/nomad's backup failed so, depending on whether the schedule had
// pushed first).
func TestBackupTarget(t *testing.T) {
	tests := []struct {
		name   string
		agents []*agent
		want   string
	}{
		{"no replica yet: the node with most room", []*agent{
			{id: "n1", available: 5 << 30}, {id: "n2", available: 1 << 30}, {id: "n3", available: 3 << 30},
		}, "n3"},
		{"the node that holds a replica", []*agent{
			{id: "n1", available: 5 << 30}, {id: "n2", available: 1 << 30, replicas: []string{"vol-a"}}, {id: "n3", available: 3 << 30},
		}, "n2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var agents clustertest.Agents
			for _, a := range tt.agents {
				agents.Serve(t, a.id, a)
			}
			cl := agents.Cluster(t)
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
			got, err := pickTarget(context.Background(), cl, src, agentclient.Volume{VolumeID: "vol-a", UsedBytes: 8 << 20}, "")
			if err != nil {
				t.Fatalf("no target: %v", err)
			}
			if got.Info.NodeID != tt.want {
				t.Errorf("backup goes to %s, want %s", got.Info.NodeID, tt.want)
			}
		})
	}
}
