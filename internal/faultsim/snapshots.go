package faultsim

import (
	"fmt"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// The CO's snapshot, restore and expansion calls. They run among the
// faults like every other call, so that tombstones, snapshot holds and
// quota changes meet crashes, moves and failovers; the invariants
// checked after every step are I1-I4. Whether a snapshot follows its
// volume through a move is issue 16's, not checked here.

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
		w.stats.SnapshotDeletes++
	}
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
