package migration

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// failover runs when no reachable node holds a primary: the volume's
// policy decides between promoting the freshest replica (target's, if it
// is as fresh) and waiting for an operator.
func (m *Migrator) failover(ctx context.Context, id string, v view, target string, log hclog.Logger) (agentclient.Copy, next, error) {
	r, ok := v.failoverReplica(target)
	if !ok {
		if !v.allAnswered() {
			return agentclient.Copy{}, answer, errdefs.Wrap(errdefs.ErrUnavailable, "no reachable node holds volume %s (not answering: %s); retry", id, v.silent())
		}
		return agentclient.Copy{}, answer, errdefs.Wrap(errdefs.ErrNotFound, "volume %s does not exist", id)
	}
	lastAt := time.Unix(0, r.copy.LastSnapshotUnixNano)
	if contract.FailoverPolicy(r.copy.Parameters) != contract.FailoverAuto {
		return agentclient.Copy{}, answer, errdefs.Wrap(errdefs.ErrUnavailable, "the primary of volume %s is unreachable and its failover policy is manual: an operator promotes a replica with `zfs-controller promote -node %s %s` (the freshest, as of %s), or brings the primary's node back",
			id, r.nodeID(), id, lastAt.UTC().Format(time.RFC3339))
	}
	return m.promote(ctx, id, r, v, false, false, log)
}

// promote promotes the replica r by failover: goOn once promoted,
// lookAgain when its reservation lost to another (reserve). operator is
// the operator's promotion (Promote), forced the operator's promotion
// without a majority (promote -force): every node that answered must
// grant the generation, and the copy records it was forced.
func (m *Migrator) promote(ctx context.Context, id string, r copyOn, v view, operator, forced bool, log hclog.Logger) (agentclient.Copy, next, error) {
	withoutMajority := !v.quorum()
	if withoutMajority && !forced {
		return agentclient.Copy{}, answer, m.noQuorum(id, v)
	}
	gen := v.nextGeneration(r.nodeID())
	lastAt, started := time.Unix(0, r.copy.LastSnapshotUnixNano), m.now()
	// A failover waits until a majority of the nodes attest that the
	// silent ones, one of which may hold the primary, have been silent for
	// a lease and its margin (docs/safety.md, "Leases"); the operator's
	// forced promotion does not.
	if n, err := m.reserve(ctx, id, gen, r.nodeID(), v, grants{everyAnswering: withoutMajority, failover: !withoutMajority, operator: operator}); n != goOn {
		return agentclient.Copy{}, n, err
	}
	if withoutMajority {
		log.Warn("promoting without a majority of the nodes, as the operator forced: the silent nodes must hold nothing newer",
			"not_answering", strings.Join(v.unreachable, ","), "generation", gen)
	}
	cctx, cancel := m.call(ctx, v)
	c, err := r.node.Agent.Promote(cctx, agentclient.Promotion{VolumeID: id, Generation: gen, Failover: true, Forced: withoutMajority})
	cancel()
	if err != nil {
		m.Metrics.count("failover", "failed")
		return agentclient.Copy{}, answer, fmt.Errorf("promoting the replica on node %s: %w", r.nodeID(), err)
	}
	rpo := m.now().Sub(lastAt)
	m.Metrics.count("failover", "ok")
	m.Metrics.failedOver(rpo, m.now().Sub(started))
	log.Warn("failover: replica promoted; writes on the lost primary after its last replicated snapshot are lost",
		"promoted_node", r.nodeID(), "generation", gen, "last_snapshot", r.copy.LastSnapshot,
		"last_snapshot_time", lastAt.UTC().Format(time.RFC3339), "rpo_seconds", int64(rpo.Seconds()))
	return c, goOn, nil
}

// Promote is the operator's failover: it promotes the replica on nodeID
// (the freshest if empty) when no reachable node holds a primary. Without
// a majority of the nodes answering it refuses, unless forced: the
// operator then asserts that the silent nodes are lost for good, or hold
// nothing newer (docs/safety.md, "Generations").
func (m *Migrator) Promote(ctx context.Context, id, nodeID string, force bool) (agentclient.Copy, error) {
	if !contract.IsVolumeID(id) {
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "%q is not a volume ID", id)
	}
	v, err := m.gather(ctx, id)
	if err != nil {
		return agentclient.Copy{}, err
	}
	if p, ok := v.primary(); ok {
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s has a primary on node %s (generation %d); publishing it elsewhere moves it", id, p.nodeID(), p.copy.Generation)
	}
	r, ok := v.freshestReplica(nodeID)
	if !ok {
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrNotFound, "no reachable node holds a replica of volume %s%s", id, map[bool]string{true: " on node " + nodeID}[nodeID != ""])
	}
	// A reservation lost to another promotion is the operator's to retry.
	c, _, err := m.promote(ctx, id, r, v, true, force, m.log.With("volume_id", id, "operator", true))
	return c, err
}
