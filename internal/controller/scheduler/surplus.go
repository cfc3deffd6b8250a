package scheduler

import (
	"context"
	"fmt"
	"slices"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
)

// Removal is a surplus copy a full plan found (docs/replication.md,
// "Surplus copies"): a replica demoted by a move, of a volume whose
// kept replicas are as fresh as it and as many as it wants.
type Removal struct {
	VolumeID string
	Node     cluster.Node
	Newest   string // the copy's newest snapshot when it was judged
	// Keepers: the nodes of the volume's primary and of the kept
	// replicas it was judged against. A CSI snapshot on the copy goes
	// with it only when every one of them holds it too.
	Keepers []cluster.Node
}

// startRemovals removes, in the background and one at a time, the
// surplus copies the last full plan found, unless an earlier round's
// removals still run (they are found again by a later plan).
func (s *Scheduler) startRemovals(ctx context.Context) {
	s.mu.Lock()
	found := s.surplusFound
	s.surplusFound = nil
	if len(found) == 0 || s.removing {
		s.mu.Unlock()
		return
	}
	s.removing = true
	s.mu.Unlock()
	s.pushes.Add(1)
	go func() {
		defer s.pushes.Done()
		defer func() {
			s.mu.Lock()
			s.removing = false
			s.mu.Unlock()
		}()
		for _, r := range found {
			if ctx.Err() != nil {
				return
			}
			s.remove(ctx, r)
		}
	}()
}

// surplusRemover is an agent that deletes a replica as a surplus copy
// (agentclient.Client does): the node checks again, under the copy's
// lock, that it is one, that its newest snapshot is still newest, and
// that every CSI snapshot on it is among elsewhere.
type surplusRemover interface {
	DeleteSurplus(ctx context.Context, volumeID, newest string, elsewhere []string) (bool, error)
}

// remove deletes one surplus copy, unless a push of its volume runs now
// (it may be making another copy fresher, or this one). The CSI
// snapshots its keepers all hold may go with it (heldByAll).
func (s *Scheduler) remove(ctx context.Context, r Removal) {
	log := s.log.With("volume_id", r.VolumeID, "node_id", r.Node.Info.NodeID, "newest", r.Newest)
	remover, ok := r.Node.Agent.(surplusRemover)
	if !ok || s.pushingTo(r.VolumeID) != "" {
		return
	}
	elsewhere, err := s.heldByAll(ctx, r.VolumeID, r.Keepers)
	if err != nil {
		log.Info("surplus copy kept for now: cannot tell which CSI snapshots its volume's other copies hold", "error", err)
		return
	}
	cctx, cancel := s.cl.Call(ctx)
	defer cancel()
	deleted, err := remover.DeleteSurplus(cctx, r.VolumeID, r.Newest, elsewhere)
	switch {
	case err != nil:
		s.Metrics.surplusCopy("kept")
		log.Info("surplus copy kept: its node refused to remove it", "error", err)
	case deleted:
		s.Metrics.surplusCopy("removed")
		s.removed.Add(1)
		log.Info("surplus copy removed: the copy a move demoted, now that the volume's replicas are as fresh")
	}
}

// heldByAll returns the IDs of the volume's CSI snapshots that every one
// of nodes holds a copy of.
func (s *Scheduler) heldByAll(ctx context.Context, volumeID string, nodes []cluster.Node) ([]string, error) {
	answers := cluster.Each(ctx, s.cl, nodes, func(ctx context.Context, n cluster.Node) ([]agentclient.Snapshot, error) {
		return n.Agent.ListSnapshots(ctx, agentclient.SnapshotQuery{SourceVolumeID: volumeID})
	})
	count := map[string]int{}
	for _, a := range answers {
		if a.Err != nil {
			return nil, fmt.Errorf("node %s: %w", a.Node.Info.NodeID, a.Err)
		}
		for _, snap := range a.Object {
			count[snap.SnapshotID]++
		}
	}
	var all []string
	for id, n := range count {
		if n == len(nodes) {
			all = append(all, id)
		}
	}
	slices.Sort(all)
	return all, nil
}

// SurplusRemoved counts the surplus copies the schedule removed.
func (s *Scheduler) SurplusRemoved() int64 { return s.removed.Load() }

// surplus returns the surplus copies among a volume's replicas: those a
// move demoted (on the nodes of existing) that are not among its kept
// replicas, were demoted at least SurplusGrace ago, have no receive to
// resume, and are no fresher than at least want kept replicas that have
// none either. So removing them loses nothing the volume's primary on
// source and those replicas do not hold (docs/replication.md, "Surplus
// copies"); the node checks again before it deletes.
func (s *Scheduler) surplus(source cluster.Node, volumeID string, want int, kept, existing []replica) []Removal {
	var out []Removal
	for _, r := range existing {
		if r.demotedAt.IsZero() || s.now().Sub(r.demotedAt) < s.SurplusGrace || r.resumable || r.newest == "" ||
			r.node.Info.NodeID == source.Info.NodeID || slices.ContainsFunc(kept, func(k replica) bool { return k.node.Info.NodeID == r.node.Info.NodeID }) {
			continue
		}
		keepers := []cluster.Node{source}
		for _, k := range kept {
			if !k.resumable && !k.last.IsZero() && k.last.Unix() > 0 && !k.last.Before(r.last) {
				keepers = append(keepers, k.node)
			}
		}
		if len(keepers)-1 >= want {
			out = append(out, Removal{VolumeID: volumeID, Node: r.node, Newest: r.newest, Keepers: keepers})
		}
	}
	return out
}
