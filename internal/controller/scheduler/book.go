package scheduler

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
)

// book is what the last full plan learned: each node's volumes version
// and what it held (with the pushes since applied), and each volume's
// source, interval and replica targets.
type book struct {
	planned  time.Time         // when the last plan that asked every node ran
	versions map[string]string // node ID -> volumes version
	held     map[string]cluster.Holding
	volumes  map[string]*booked
}

// booked is one volume in the book.
type booked struct {
	source   cluster.Node
	want     int
	interval time.Duration
	targets  []replica
}

// currentBook returns the book if it still describes the nodes (the same
// healthy nodes, within Resync of the full plan) and the nodes whose
// volumes version differs from the one the book saw: their primaries
// changed since.
func (s *Scheduler) currentBook(healthy []cluster.Node) (*book, map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.book
	resync := s.Resync
	if resync <= 0 {
		resync = DefaultResync
	}
	if b == nil || len(healthy) != len(b.versions) || s.now().Sub(b.planned) >= resync || s.now().Before(b.planned) {
		return nil, nil
	}
	changed := map[string]bool{}
	for _, n := range healthy {
		v, ok := b.versions[n.Info.NodeID]
		if !ok {
			return nil, nil
		}
		if v == "" || v != n.Info.VolumesVersion {
			changed[n.Info.NodeID] = true
		}
	}
	return b, changed
}

// planFromBook returns the pushes due by the book.
func (s *Scheduler) planFromBook(b *book) []Push {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pushes []Push
	s.Metrics.reset()
	for _, id := range sortedKeys(b.volumes) {
		v := b.volumes[id]
		var have []replica
		for _, t := range v.targets {
			if !t.last.IsZero() {
				have = append(have, t)
			}
		}
		s.Metrics.observe(id, v.want, v.interval, have, s.now())
		targets := slices.Clone(v.targets)
		slices.SortStableFunc(targets, func(a, b replica) int { return a.last.Compare(b.last) })
		for _, t := range targets {
			if reason := s.due(t, v.interval); reason != "" {
				pushes = append(pushes, Push{VolumeID: id, Source: v.source, Target: t.node, Reason: reason})
			}
		}
	}
	return pushes
}

// recordPush brings the book up to date after a push: a replica pushed at
// started is as fresh as then; a push refused because the source no
// longer holds the volume's primary sends the next round to a full plan.
func (s *Scheduler) recordPush(p Push, started time.Time, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.book == nil {
		return
	}
	if err != nil {
		if sourceGone(err) {
			s.book = nil
		}
		return
	}
	v, ok := s.book.volumes[p.VolumeID]
	if !ok {
		return
	}
	for i, t := range v.targets {
		if t.node.Info.NodeID == p.Target.Info.NodeID {
			v.targets[i].last, v.targets[i].resumable = started, false
		}
	}
	if h, ok := s.book.held[p.Target.Info.NodeID]; ok {
		s.book.held[p.Target.Info.NodeID] = pushedTo(h, p.VolumeID, started)
	}
}

// pushedTo returns what a node holds after a push of a volume to it
// that started at started: a replica as fresh as then.
func pushedTo(h cluster.Holding, volumeID string, started time.Time) cluster.Holding {
	replicas := slices.Clone(h.Status.Replicas)
	i := slices.IndexFunc(replicas, func(r agentclient.Replica) bool { return r.VolumeID == volumeID })
	if i < 0 {
		replicas, i = append(replicas, agentclient.Replica{VolumeID: volumeID}), len(replicas)
	}
	replicas[i].LastSnapshotUnix, replicas[i].Resumable = started.Unix(), false
	h.Status.Replicas = replicas
	return h
}

// Held returns the IDs of the primaries the book keeps for a node, and
// the volumes version the node reported when the book learned them;
// false when the book keeps nothing of it. For checks: while the node
// reports that version, the IDs must be its primaries.
func (s *Scheduler) Held(nodeID string) (volumeIDs []string, version string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.book == nil {
		return nil, "", false
	}
	h, ok := s.book.held[nodeID]
	if !ok {
		return nil, "", false
	}
	for _, v := range h.Volumes {
		volumeIDs = append(volumeIDs, v.VolumeID)
	}
	slices.Sort(volumeIDs)
	return volumeIDs, s.book.versions[nodeID], true
}

// knownHolding returns what node n holds without asking it for
// everything: as the book old keeps it while n's volumes version stays,
// and with what n tells changed since the version old saw applied when
// it moved (changedHolding). False when old is nil or n cannot tell.
func (s *Scheduler) knownHolding(ctx context.Context, old *book, changed map[string]bool, n cluster.Node) (cluster.Holding, bool) {
	if old == nil {
		return cluster.Holding{}, false
	}
	s.mu.Lock()
	h, held := old.held[n.Info.NodeID]
	since := old.versions[n.Info.NodeID]
	s.mu.Unlock()
	if !held || !changed[n.Info.NodeID] {
		return h, held
	}
	return s.changedHolding(ctx, n, h, since)
}

// changeTeller is an agent that tells what changed on its node since a
// volumes version (agentclient.Client does).
type changeTeller interface {
	Changes(ctx context.Context, since string) (agentclient.Changes, error)
}

// changedHolding asks node n what changed since it reported version
// since, and applies that to h, what it held then: the node reads the
// volumes that changed, not all of them. False when n cannot tell (a
// restart, too many changes, an agent without the call): ask in full.
func (s *Scheduler) changedHolding(ctx context.Context, n cluster.Node, h cluster.Holding, since string) (cluster.Holding, bool) {
	teller, ok := n.Agent.(changeTeller)
	if !ok || since == "" {
		return cluster.Holding{}, false
	}
	cctx, cancel := s.cl.Call(ctx)
	defer cancel()
	ch, err := teller.Changes(cctx, since)
	if err != nil {
		s.log.Debug("asking a node what changed failed; asking it for everything", "node_id", n.Info.NodeID, "error", err)
		return cluster.Holding{}, false
	}
	if !ch.Known {
		return cluster.Holding{}, false
	}
	return applyChanges(h, ch), true
}

// applyChanges returns h with the primaries and replicas of the volumes
// ch tells changed replaced by what ch says they are now.
func applyChanges(h cluster.Holding, ch agentclient.Changes) cluster.Holding {
	changed := make(map[string]bool, len(ch.VolumeIDs))
	for _, id := range ch.VolumeIDs {
		changed[id] = true
	}
	h.Volumes = replaceChanged(h.Volumes, ch.Volumes, changed, func(v agentclient.Volume) string { return v.VolumeID })
	h.Status.Replicas = replaceChanged(h.Status.Replicas, ch.Replicas, changed, func(r agentclient.Replica) string { return r.VolumeID })
	return h
}

// replaceChanged returns a copy of old without the items of changed
// volumes, with now's added, sorted by volume ID.
func replaceChanged[T any](old, now []T, changed map[string]bool, volumeID func(T) string) []T {
	out := slices.DeleteFunc(slices.Clone(old), func(item T) bool { return changed[volumeID(item)] })
	out = append(out, now...)
	slices.SortFunc(out, func(a, b T) int { return strings.Compare(volumeID(a), volumeID(b)) })
	return out
}
