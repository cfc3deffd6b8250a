package cluster

import (
	"context"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// WorkLeaseAsker asks every node of c for the work lease: the nodes a
// controller instance's worklease.Holder reaches. Majorities are taken
// over Members, as the generation promises' are.
func WorkLeaseAsker(c *Cluster) worklease.AskFunc {
	return func(ctx context.Context, self worklease.Instance, release bool) ([]worklease.Reply, int, error) {
		answers, unreachable, err := Ask(ctx, c, func(ctx context.Context, a Agent) (worklease.Lease, error) {
			return a.AcquireWorkLease(ctx, self, release)
		})
		if err != nil {
			return nil, 0, err
		}
		replies := make([]worklease.Reply, 0, len(answers)+len(unreachable))
		nodes := make([]Node, 0, len(answers))
		for _, a := range answers {
			nodes = append(nodes, a.Node)
			replies = append(replies, worklease.Reply{Node: a.Node.Info.NodeID, Lease: a.Object, Err: a.Err})
		}
		for _, u := range unreachable {
			replies = append(replies, worklease.Reply{Node: u.Addr, Err: u.Err})
		}
		return replies, Members(nodes, len(unreachable)), nil
	}
}
