package operator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// peerRetirer is a node agent that retires a peer (agentclient.Client).
type peerRetirer interface {
	RetirePeer(ctx context.Context, nodeID string) (knownNodes int, err error)
}

// RetireNode makes every node stop counting node, a node whose plugin the
// operator stopped for good, for its lease, so that the majorities are
// taken over the nodes left without restarting them (docs/operations.md,
// "Retiring"). It asks every node the list names and refuses, changing
// nothing, while:
//   - node itself answers: it is still running;
//   - a node does not answer: it would keep counting node, and could
//     later retire another node while the rest retired this one (two
//     nodes counted differently, where the argument allows one);
//   - a node retired another node since it started: the same.
//
// Each node refuses on its own until it has heard nothing from node for
// the lease and its margin (lease.Monitor.Retire). Running it again
// after a partial run finishes it: a node retires the same node twice
// as once.
func RetireNode(ctx context.Context, cl *cluster.Cluster, node string, out io.Writer) error {
	if node == "" {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "no node named: give the node ID (Nomad's client name) of the node to retire")
	}
	nodes, unreachable, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	if err := retirable(node, nodes, unreachable); err != nil {
		return err
	}
	var errs []error
	for _, n := range nodes {
		r, ok := n.Agent.(peerRetirer)
		if !ok {
			errs = append(errs, fmt.Errorf("node %s: this agent client cannot retire peers", n.Info.NodeID))
			continue
		}
		known, err := r.RetirePeer(ctx, node)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.Info.NodeID, err))
			continue
		}
		fmt.Fprintf(out, "%s no longer counts %s: its lease counts %d nodes, itself included\n", n.Info.NodeID, node, known)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w\n(the nodes above retired %s; run retire-node again to finish)", errors.Join(errs...), node)
	}
	return nil
}

// retirable checks, from every node's answer, that node may be retired
// now.
func retirable(node string, nodes []cluster.Node, unreachable []cluster.Unreachable) error {
	if len(unreachable) > 0 {
		var addrs []string
		for _, u := range unreachable {
			addrs = append(addrs, u.Addr)
		}
		return errdefs.Wrap(errdefs.ErrUnavailable, "retiring %s needs every node's answer, and %s did not answer: bring it back (a stopped node's agent leaves the peer list once Nomad deregisters its service) and retry",
			node, strings.Join(addrs, ", "))
	}
	for _, n := range nodes {
		if n.Info.NodeID == node {
			return errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s still answers at %s: move its volumes and replicas off it and stop its node plugin first (docs/operations.md, \"Retiring\"), then retry once it has been silent for the lease and its margin",
				node, n.Addr)
		}
		for _, other := range n.Info.RetiredNodes {
			if other != node {
				return errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s retired %s since it started, and a node retires one node per start: restart its node plugin first (nomad alloc restart), then retire %s",
					n.Info.NodeID, other, node)
			}
		}
	}
	if !slices.ContainsFunc(nodes, func(n cluster.Node) bool { return n.Info.KnownNodes > 0 }) {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "no node keeps a lease (no peers configured), so no node counts %s: there is nothing to retire", node)
	}
	return nil
}
