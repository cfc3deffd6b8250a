package agentcontract

import (
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
)

// fakeWorld is nodeIDs as the controller tests' fake agents.
type fakeWorld struct {
	agents map[string]*clustertest.FakeAgent
}

func (w *fakeWorld) agent(id string) cluster.NodeAgent { return w.agents[id] }
func (w *fakeWorld) addr(id string) string             { return id + ":7670" }

// startFakes makes the fake agents holding what holdings says, with the
// fakes' own setters.
func startFakes(_ *testing.T, holdings map[string]holding) world {
	var fakes clustertest.Fakes
	w := &fakeWorld{agents: map[string]*clustertest.FakeAgent{}}
	for _, id := range nodeIDs {
		a := fakes.Add(agentclient.NodeInfo{NodeID: id})
		arrangeFake(a, holdings[id])
		w.agents[id] = a
	}
	return w
}

// arrangeFake gives the fake what h says: the copy, then the promise.
func arrangeFake(a *clustertest.FakeAgent, h holding) {
	if h.role != "" {
		c := agentclient.Copy{VolumeID: volID, Name: volName, Role: h.role, Generation: h.generation, CapacityBytes: capacity,
			Mounted: h.mounted, MovingTo: h.fencedFor, LeaseFenced: h.leaseFenced}
		if h.fencedFor != "" {
			c.FencedUnixNano = fencedAt
		}
		if h.snapshotAt != 0 {
			c.LastSnapshot, c.LastSnapshotUnixNano = snapshotName(h.snapshotAt), h.snapshotAt
		}
		a.PutCopy(c)
	}
	if h.promise.generation > 0 {
		a.Promise(volID, h.promise.generation, h.promise.holder)
	}
}
