package provision

import (
	"context"
	"sort"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Page asks for part of a listing: the items from StartingToken on (the
// NextToken of the page before; empty: from the start), at most
// MaxEntries of them (zero: all).
type Page struct {
	StartingToken string
	MaxEntries    int32
}

// VolumePage is one page of the cluster's volumes, sorted by ID, each on
// the node of its newest primary; NextToken starts the next page (empty
// after the last).
type VolumePage struct {
	Volumes   []cluster.Located[agentclient.Volume]
	NextToken string
}

// ListVolumes answers a page from each node's page: every node lists its
// first MaxEntries+1 primaries from the token on, which holds the first
// MaxEntries+1 distinct volumes of all nodes (a node's volumes before any
// one of them are among the cluster's before it), so a page costs each
// node in proportion to the page, not to its volumes. A node that does
// not answer is left out (and logged): listings are informational.
func (p *Provisioner) ListVolumes(ctx context.Context, req Page) (VolumePage, error) {
	if req.MaxEntries < 0 {
		return VolumePage{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "max_entries must not be negative")
	}
	if token := req.StartingToken; token != "" && !contract.IsVolumeID(token) {
		return VolumePage{}, errBadToken(token)
	}
	nodeReq := agentclient.Page{From: req.StartingToken}
	if req.MaxEntries > 0 {
		nodeReq.MaxEntries = uint32(req.MaxEntries) + 1
	}
	all, err := p.volumesFrom(ctx, nodeReq)
	if err != nil {
		return VolumePage{}, err
	}
	page, next, err := paginate(all, func(v cluster.Located[agentclient.Volume]) string { return v.Object.VolumeID },
		req.StartingToken, req.MaxEntries, contract.IsVolumeID)
	if err != nil {
		return VolumePage{}, err
	}
	return VolumePage{Volumes: page, NextToken: next}, nil
}

func errBadToken(token string) error {
	return errdefs.Wrap(errdefs.ErrAborted, "starting_token %q is not a token this plugin issued; list again from the start", token)
}

// volumesFrom lists the nodes' primaries as page asks (all, or a page from
// an ID on), sorted by ID, the newest generation of each.
func (p *Provisioner) volumesFrom(ctx context.Context, page agentclient.Page) ([]cluster.Located[agentclient.Volume], error) {
	out, err := fromEveryNode(ctx, p, "volumes", func(ctx context.Context, n cluster.Node) ([]agentclient.Volume, error) {
		return n.Agent.ListVolumes(ctx, page)
	})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Object.VolumeID < out[j].Object.VolumeID })
	return newestGenerations(out), nil
}

// fromEveryNode asks every node for a list at once and joins the lists,
// each item with its node. A node that does not answer is logged and left
// out: listings are informational (what names the items in the log).
func fromEveryNode[T any](ctx context.Context, p *Provisioner, what string, list func(context.Context, cluster.Node) ([]T, error)) ([]cluster.Located[T], error) {
	nodes, _, err := p.cluster.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []cluster.Located[T]
	for _, a := range cluster.Each(ctx, p.cluster, nodes, list) {
		if a.Err != nil {
			p.log.Warn("listing the "+what+" of a node failed; the list is incomplete", "node_id", a.Node.Info.NodeID, "error", a.Err)
			continue
		}
		for _, item := range a.Object {
			out = append(out, cluster.Located[T]{Node: a.Node, Object: item})
		}
	}
	return out, nil
}

// newestGenerations keeps, of a volume listed by two nodes (the moment
// between a move's promotion and the old copy's demotion), the newest
// generation. items are sorted by volume ID.
func newestGenerations(items []cluster.Located[agentclient.Volume]) []cluster.Located[agentclient.Volume] {
	var out []cluster.Located[agentclient.Volume]
	for _, it := range items {
		last := len(out) - 1
		if last >= 0 && out[last].Object.VolumeID == it.Object.VolumeID {
			if it.Object.Generation > out[last].Object.Generation {
				out[last] = it
			}
			continue
		}
		out = append(out, it)
	}
	return out
}

// paginate returns one page of items sorted by key. The token is the key of
// the first item of the next page; a token that is not a key of this
// driver is refused with Aborted, as the CSI spec asks.
func paginate[T any](items []T, key func(T) string, token string, maxEntries int32, validToken func(string) bool) ([]T, string, error) {
	if maxEntries < 0 {
		return nil, "", errdefs.Wrap(errdefs.ErrInvalidArgument, "max_entries must not be negative")
	}
	start := 0
	if token != "" {
		if !validToken(token) {
			return nil, "", errBadToken(token)
		}
		start = sort.Search(len(items), func(i int) bool { return key(items[i]) >= token })
	}
	end := len(items)
	if maxEntries > 0 && start+int(maxEntries) < end {
		end = start + int(maxEntries)
	}
	next := ""
	if end < len(items) {
		next = key(items[end])
	}
	return items[start:end], next, nil
}
