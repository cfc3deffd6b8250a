package faultsim

import (
	"fmt"
	"strings"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// The CO's snapshot, restore and expansion calls. They run among the
// faults like every other call, so that tombstones, snapshot holds and
// quota changes meet crashes, moves and failovers; the invariants
// checked after every step are I1-I4. A deleted snapshot stays deleted
// (D1, docs/replication.md "Deleted while a node was away"): the CO lists
// the snapshots and tries to restore a deleted one now and then, and
// either seeing a deleted snapshot while a majority of the nodes answer
// breaks D1. Whether a snapshot follows its volume through a move is not
// checked here.

// simSnapshot is a CSI snapshot CreateSnapshot answered OK for.
type simSnapshot struct{ name, id, volume string }

// maxRestores bounds the volumes restores add to a run.
const maxRestores = 3

func (w *world) snapshot(v *simVolume) {
	if !v.created {
		return
	}
	ctx, cancel := opContext()
	defer cancel()
	w.snapshotsTaken++
	name := fmt.Sprintf("%s-snap%d", v.name, w.snapshotsTaken)
	resp, err := w.ctl.CreateSnapshot(ctx, &csispec.CreateSnapshotRequest{SourceVolumeId: v.id, Name: name})
	w.tracef("co: CreateSnapshot %s of %s: %v", name, v.name, errText(err))
	if err == nil {
		w.snaps = append(w.snaps, &simSnapshot{name: name, id: resp.GetSnapshot().GetSnapshotId(), volume: v.id})
		w.stats.Snapshots++
	}
}

func (w *world) deleteSnapshot() {
	if len(w.snaps) == 0 {
		return
	}
	i := w.dice.intn(len(w.snaps))
	s := w.snaps[i]
	ctx, cancel := opContext()
	defer cancel()
	_, err := w.ctl.DeleteSnapshot(ctx, &csispec.DeleteSnapshotRequest{SnapshotId: s.id})
	w.tracef("co: DeleteSnapshot %s: %v", s.name, errText(err))
	if err == nil {
		w.snaps = append(w.snaps[:i], w.snaps[i+1:]...)
		w.deletedSnaps = append(w.deletedSnaps, s)
		w.stats.SnapshotDeletes++
	}
}

// finishDeletions is the controller's pass over the snapshots deleted
// while a node was away (provision.FinishDeletions, every minute in
// zfs-controller).
func (w *world) finishDeletions() {
	ctx, cancel := opContext()
	defer cancel()
	err := w.deletions.FinishDeletions(ctx)
	w.tracef("controller: finish snapshot deletions: %v", errText(err))
}

// checkDeletedStayDeleted lists the snapshots and restores a deleted one,
// as a CO may, and reports D1 broken when a deleted snapshot shows while
// a majority of the nodes answer the controller. A check that found a
// deleted snapshot's copy left on some node counts in Stats, so that runs
// show they tried the hard case.
func (w *world) checkDeletedStayDeleted() {
	if len(w.deletedSnaps) == 0 {
		return
	}
	reached := 0
	for _, n := range w.nodes {
		if w.reaches(n) {
			reached++
		}
	}
	if reached <= len(w.nodes)/2 {
		return
	}
	ctx, cancel := opContext()
	defer cancel()
	resp, err := w.ctl.ListSnapshots(ctx, &csispec.ListSnapshotsRequest{})
	w.tracef("co: ListSnapshots: %d, %v", len(resp.GetEntries()), errText(err))
	for _, e := range resp.GetEntries() {
		for _, d := range w.deletedSnaps {
			if e.GetSnapshot().GetSnapshotId() == d.id {
				w.checker.late(fmt.Errorf("D1 broken: snapshot %s was deleted, and ListSnapshots lists it (on %d of %d nodes answering)", d.name, reached, len(w.nodes)))
			}
		}
	}
	d := w.deletedSnaps[w.dice.intn(len(w.deletedSnaps))]
	if w.copiesLeft(d.id) > 0 {
		w.stats.DeletedCopiesHidden++
	}
	_, err = w.ctl.CreateVolume(ctx, &csispec.CreateVolumeRequest{Name: "from-" + d.name, VolumeCapabilities: []*csispec.VolumeCapability{mountCapability},
		VolumeContentSource: &csispec.VolumeContentSource{Type: &csispec.VolumeContentSource_Snapshot{Snapshot: &csispec.VolumeContentSource_SnapshotSource{SnapshotId: d.id}}}})
	w.tracef("co: CreateVolume from deleted snapshot %s: %v", d.name, errText(err))
	if err == nil {
		w.checker.late(fmt.Errorf("D1 broken: snapshot %s was deleted, and a volume was restored from it", d.name))
	}
}

// copiesLeft counts the copies of snapshot id on the nodes' pools.
func (w *world) copiesLeft(id string) int {
	n := 0
	for _, node := range w.nodes {
		for _, name := range node.pool.Names() {
			if strings.HasSuffix(name, "@"+id) {
				n++
			}
		}
	}
	return n
}

// restore creates a new volume from a snapshot; the CO then uses it like
// any other.
func (w *world) restore() {
	if len(w.snaps) == 0 || w.restores >= maxRestores {
		return
	}
	s := w.snaps[w.dice.intn(len(w.snaps))]
	v := newSimVolume(fmt.Sprintf("restore%d", w.restores))
	ctx, cancel := opContext()
	defer cancel()
	_, err := w.ctl.CreateVolume(ctx, &csispec.CreateVolumeRequest{Name: v.name, VolumeCapabilities: []*csispec.VolumeCapability{mountCapability},
		Parameters:          map[string]string{vocab.ParamReplicas: "1", vocab.ParamFailover: vocab.FailoverAuto},
		VolumeContentSource: &csispec.VolumeContentSource{Type: &csispec.VolumeContentSource_Snapshot{Snapshot: &csispec.VolumeContentSource_SnapshotSource{SnapshotId: s.id}}}})
	w.tracef("co: CreateVolume %s from snapshot %s: %v", v.name, s.name, errText(err))
	if err == nil {
		w.restores++
		v.created = true
		w.vols = append(w.vols, v)
		w.checker.created(v.id)
		w.stats.Restores++
	}
}

func (w *world) expand(v *simVolume) {
	if !v.created {
		return
	}
	ctx, cancel := opContext()
	defer cancel()
	size := int64(1+w.dice.intn(4)) << 30
	_, err := w.ctl.ControllerExpandVolume(ctx, &csispec.ControllerExpandVolumeRequest{VolumeId: v.id, CapacityRange: &csispec.CapacityRange{RequiredBytes: size}})
	w.tracef("co: ControllerExpandVolume %s to %d GiB: %v", v.name, size>>30, errText(err))
	if err == nil {
		w.stats.Expands++
	}
}
