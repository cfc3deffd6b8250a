package faultsim

import (
	"context"
	"fmt"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// gatedAgent is a node agent as one controller instance of the explorer
// reaches it: the real agent client over the in-memory network, each
// call gated by the scheduler (explSched.call): its request, then its
// answer, wait to be let through. GetNode alone goes through at once,
// failing on a link that is down: what a node says of itself (its ID,
// its lease's members) is no copy's state, and gating it would double
// the events of every look at the copies for no interleaving that
// matters.
type gatedAgent struct {
	x     *explRun
	ctl   string // the calling instance
	node  string // the node this address reaches
	addr  string
	inner cluster.NodeAgent
}

var _ cluster.NodeAgent = (*gatedAgent)(nil)

// gated runs one call of g through the scheduler.
func gated[T any](g *gatedAgent, method, args string, read bool, also []string, f func() (T, error)) (T, error) {
	var out T
	err := g.x.s.call(explSpec{actor: g.ctl, node: g.node, method: method, args: args, read: read, also: also}, func() (string, error) {
		v, err := f()
		out = v
		return describe(v, err), err
	})
	if err != nil && errLostIs(err) {
		var zero T
		return zero, err
	}
	return out, err
}

func gated0(g *gatedAgent, method, args string, read bool, f func() error) error {
	_, err := gated(g, method, args, read, nil, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

func (g *gatedAgent) GetNode(ctx context.Context, opts agentclient.GetNodeOptions) (agentclient.NodeInfo, error) {
	g.x.s.mu.Lock()
	why := g.x.s.linkDownLocked(g.ctl, g.node)
	g.x.s.mu.Unlock()
	if why != "" {
		return agentclient.NodeInfo{}, errLost(why)
	}
	return g.inner.GetNode(ctx, opts)
}

func (g *gatedAgent) CreateVolume(ctx context.Context, v agentclient.NewVolume) (agentclient.Volume, error) {
	return gated(g, "CreateVolume", v.Name, false, nil, func() (agentclient.Volume, error) { return g.inner.CreateVolume(ctx, v) })
}

func (g *gatedAgent) DeleteVolume(ctx context.Context, id string) error {
	return gated0(g, "DeleteVolume", "", false, func() error { return g.inner.DeleteVolume(ctx, id) })
}

func (g *gatedAgent) GetVolume(ctx context.Context, id string) (agentclient.Volume, error) {
	return gated(g, "GetVolume", "", true, nil, func() (agentclient.Volume, error) { return g.inner.GetVolume(ctx, id) })
}

func (g *gatedAgent) ListVolumes(ctx context.Context, page agentclient.Page) ([]agentclient.Volume, error) {
	return gated(g, "ListVolumes", "", true, nil, func() ([]agentclient.Volume, error) { return g.inner.ListVolumes(ctx, page) })
}

func (g *gatedAgent) ExpandVolume(ctx context.Context, id string, required, limit uint64) (uint64, error) {
	return gated(g, "ExpandVolume", "", false, nil, func() (uint64, error) { return g.inner.ExpandVolume(ctx, id, required, limit) })
}

func (g *gatedAgent) CreateSnapshot(ctx context.Context, source, name string, after int64) (agentclient.Snapshot, error) {
	return gated(g, "CreateSnapshot", name, false, nil, func() (agentclient.Snapshot, error) { return g.inner.CreateSnapshot(ctx, source, name, after) })
}

func (g *gatedAgent) DeleteSnapshot(ctx context.Context, d agentclient.SnapshotDeletion) error {
	return gated0(g, "DeleteSnapshot", "", false, func() error { return g.inner.DeleteSnapshot(ctx, d) })
}

func (g *gatedAgent) ListSnapshots(ctx context.Context, q agentclient.SnapshotQuery) ([]agentclient.Snapshot, error) {
	return gated(g, "ListSnapshots", "", true, nil, func() ([]agentclient.Snapshot, error) { return g.inner.ListSnapshots(ctx, q) })
}

func (g *gatedAgent) Replicate(ctx context.Context, id string, to agentclient.Target, purpose string, each func(agentclient.Progress)) (agentclient.Progress, error) {
	return gated(g, "Replicate", "to "+to.NodeID, false, []string{to.NodeID}, func() (agentclient.Progress, error) {
		return g.inner.Replicate(ctx, id, to, purpose, each)
	})
}

func (g *gatedAgent) Status(ctx context.Context) (agentclient.NodeStatus, error) {
	return gated(g, "Status", "", true, nil, func() (agentclient.NodeStatus, error) { return g.inner.Status(ctx) })
}

func (g *gatedAgent) DeleteReplica(ctx context.Context, id string, volumeDeleted bool) (bool, error) {
	return gated(g, "DeleteReplica", "", false, nil, func() (bool, error) { return g.inner.DeleteReplica(ctx, id, volumeDeleted) })
}

func (g *gatedAgent) GetCopy(ctx context.Context, id string) (agentclient.Copy, error) {
	return gated(g, "GetCopy", "", true, nil, func() (agentclient.Copy, error) { return g.inner.GetCopy(ctx, id) })
}

func (g *gatedAgent) MoveFinal(ctx context.Context, id, targetAddr, targetNodeID string) (agentclient.Progress, error) {
	return gated(g, "MoveFinal", "to "+targetNodeID, false, []string{targetNodeID}, func() (agentclient.Progress, error) {
		return g.inner.MoveFinal(ctx, id, targetAddr, targetNodeID)
	})
}

func (g *gatedAgent) Unfence(ctx context.Context, id string, gen uint64) (agentclient.Copy, error) {
	return gated(g, "Unfence", fmt.Sprintf("gen %d", gen), false, nil, func() (agentclient.Copy, error) { return g.inner.Unfence(ctx, id, gen) })
}

func (g *gatedAgent) Promote(ctx context.Context, p agentclient.Promotion) (agentclient.Copy, error) {
	args := fmt.Sprintf("gen %d", p.Generation)
	if p.Forced {
		args += " forced"
	}
	return gated(g, "Promote", args, false, nil, func() (agentclient.Copy, error) { return g.inner.Promote(ctx, p) })
}

func (g *gatedAgent) Demote(ctx context.Context, d agentclient.Demotion) (agentclient.Copy, error) {
	return gated(g, "Demote", fmt.Sprintf("below gen %d", d.Generation), false, nil, func() (agentclient.Copy, error) { return g.inner.Demote(ctx, d) })
}

func (g *gatedAgent) Reserve(ctx context.Context, r agentclient.Reservation) (agentclient.Promise, error) {
	args := fmt.Sprintf("gen %d for %s", r.Generation, r.HolderNodeID)
	if r.Failover {
		args += " failover"
	}
	return gated(g, "Reserve", args, false, nil, func() (agentclient.Promise, error) { return g.inner.Reserve(ctx, r) })
}

func (g *gatedAgent) AcquireWorkLease(ctx context.Context, self worklease.Instance, release bool) (worklease.Lease, error) {
	return gated(g, "AcquireWorkLease", "", false, nil, func() (worklease.Lease, error) { return g.inner.AcquireWorkLease(ctx, self, release) })
}

func (g *gatedAgent) WorkLeases(ctx context.Context) (worklease.Lease, error) {
	return gated(g, "WorkLeases", "", true, nil, func() (worklease.Lease, error) { return g.inner.WorkLeases(ctx) })
}

// describe says in a few words what a call answered, for the trace.
func describe(v any, err error) string {
	if err != nil {
		return errText(err)
	}
	switch v := v.(type) {
	case agentclient.Copy:
		if !v.Exists && v.Role == "" {
			return fmt.Sprintf("no copy (promised gen %d to %q)", v.PromisedGeneration, v.PromisedHolder)
		}
		s := fmt.Sprintf("%s gen %d", v.Role, v.Generation)
		if v.MovingTo != "" {
			s += " fenced for " + v.MovingTo
		}
		if v.LeaseFenced {
			s += " lease-fenced"
		}
		if v.Mounted {
			s += " mounted"
		}
		if v.ForcedGeneration != 0 {
			s += fmt.Sprintf(" forced at %d", v.ForcedGeneration)
		}
		if v.PromisedGeneration != 0 {
			s += fmt.Sprintf(", promised gen %d to %s", v.PromisedGeneration, v.PromisedHolder)
		}
		return s
	case agentclient.Promise:
		if v.Granted {
			return "granted"
		}
		return fmt.Sprintf("refused: promised gen %d to %s", v.PromisedGeneration, v.PromisedHolder)
	case agentclient.Progress:
		return fmt.Sprintf("ok (%s push of %s, fenced at %d)", v.Kind, v.Snapshot, v.FencedAt)
	}
	return "ok"
}
