package provision

import (
	"context"
	"errors"
	"fmt"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// OwnerOf returns the recorded parameters that name volume id's owner
// (contract.ParamOwnerDigest; none when it has no owner), read from its
// copies on the nodes that answer: a primary or a replica, each keeps its
// volume's parameters, so a volume whose primary is lost keeps its owner.
// With no copy among the answers and a node silent it answers
// Unavailable: the silent node may hold the only one. With every node
// answering and no copy anywhere there is no owner to check.
func (p *Provisioner) OwnerOf(ctx context.Context, id string) (map[string]string, error) {
	answers, silent, err := cluster.FindAll(ctx, p.cluster, func(ctx context.Context, a cluster.Agent) (agentclient.Copy, error) {
		return a.GetCopy(ctx, id)
	})
	if err != nil {
		return nil, err
	}
	held := false
	for _, a := range answers {
		if !a.Object.Exists {
			continue
		}
		held = true
		if d, ok := a.Object.Parameters[contract.ParamOwnerDigest]; ok {
			return map[string]string{contract.ParamOwnerDigest: d}, nil
		}
	}
	if !held && len(silent) > 0 {
		return nil, fmt.Errorf("%w: cannot tell whether volume %s has an owner: no node that answered holds a copy (%v); retry once every node answers", errdefs.ErrUnavailable, id, errors.Join(silent...))
	}
	return nil, nil
}
