package faultsim

import (
	"fmt"
	"strings"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// The CO's snapshot, restore and expansion calls. They run among the
// faults like every other call, so that tombstones, snapshot holds and
// quota changes meet crashes, moves and failovers; the invariants
// checked after every step are I1-I4. A deleted snapshot stays deleted
// (D1, docs/replication.md "Deleted snapshots"): the CO lists the
// snapshots and tries to restore a deleted one now and then, deletes
// snapshots while a push carrying them is held (deleteDuringPush), and
// either seeing a deleted snapshot while a majority of the nodes answer
// breaks D1. A snapshot is never lost (S1): until a DeleteSnapshot of it
// was tried, some node's pool holds a copy after every step, whatever
// moves, failovers, replica removals and volume deletions happened. Once
// the run's faults end and every node is back, each snapshot the CO holds
// is listed exactly once and a volume can be restored from it (S2).

// simSnapshot is a CSI snapshot CreateSnapshot answered OK for.
// deleteTried is set when a DeleteSnapshot of it failed: it may be gone
// from some nodes or all, so S1 no longer holds it.
type simSnapshot struct {
	name, id, volume string
	deleteTried      bool
}

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
	resp, err := w.co().ctl.CreateSnapshot(ctx, &csispec.CreateSnapshotRequest{SourceVolumeId: v.id, Name: name})
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
	w.deleteSnapshotAt(w.dice.intn(len(w.snaps)))
}

// deleteSnapshotAt deletes the CO's snapshot w.snaps[i]; it tells whether
// the delete answered OK.
func (w *world) deleteSnapshotAt(i int) bool {
	s := w.snaps[i]
	ctx, cancel := opContext()
	defer cancel()
	_, err := w.co().ctl.DeleteSnapshot(ctx, &csispec.DeleteSnapshotRequest{SnapshotId: s.id})
	w.tracef("co: DeleteSnapshot %s: %v", s.name, errText(err))
	if err != nil {
		s.deleteTried = true
		return false
	}
	w.snaps = append(w.snaps[:i], w.snaps[i+1:]...)
	w.deletedSnaps = append(w.deletedSnaps, s)
	w.stats.SnapshotDeletes++
	return true
}

// deleteDuringPush deletes a snapshot while a push that carries it runs:
// the CO snapshots v, an operator's push of v from one node to another is
// held after its header (the sender's stream is made, the receiver has
// begun, nothing has landed), the snapshot is deleted, and the push goes
// on and lands its copy after the delete answered (unless a fault
// breaks it). That copy must never be listed or restored (D1), and must
// go.
func (w *world) deleteDuringPush(v *simVolume, from, to *simNode) {
	if !v.created || from == to {
		return
	}
	before := len(w.snaps)
	if w.snapshot(v); len(w.snaps) == before {
		return
	}
	hold := w.net.holdPush(from.id, to.id, w.snaps[before].id)
	pushed := make(chan struct{})
	go func() {
		defer close(pushed)
		w.backup(v, from, to)
	}()
	select {
	case <-hold.reached:
		w.tracef("co: a push of %s %s->%s is held with snapshot %s in it", v.name, from.id, to.id, w.snaps[before].name)
		if w.deleteSnapshotAt(before) {
			w.stats.DeletedInFlight++
		}
	case <-pushed: // no stream of the snapshot (not the primary, refused, a fault)
	}
	w.net.release(hold)
	<-pushed
}

// snapshotsKept is S1: every snapshot the CO holds whose deletion was
// never tried has a copy on some node's pool.
func (w *world) snapshotsKept() error {
	for _, s := range w.snaps {
		if !s.deleteTried && w.copiesLeft(s.id) == 0 {
			return fmt.Errorf("S1 broken: snapshot %s of volume %s was taken and never deleted, and no node's pool holds a copy", s.name, s.volume)
		}
	}
	return nil
}

// settle ends the run's faults (the network heals, every node is started
// again) and checks S2: ListSnapshots lists each snapshot the CO holds
// exactly once and no deleted one, and a volume is restored from one of
// them. A listing leaves out a node that did not answer (a lost message:
// listings are informational, provision.fromEveryNode), so S2 is broken
// only when no listing of settleRetries is right. It does nothing in a
// run that took no snapshot.
func (w *world) settle() error {
	if len(w.snaps)+len(w.deletedSnaps) == 0 {
		return nil
	}
	w.splitAgain = nil // the split ends with the run
	w.heal()
	for _, n := range w.nodes {
		n.restartAt = 0
	}
	var wrong error
	for range settleRetries {
		if err := w.settleStep(); err != nil {
			return err
		}
		if wrong = w.listedOnce(); wrong == nil {
			return w.restoreSettled()
		}
	}
	return fmt.Errorf("S2 broken: with every node up, %d listings in a row were wrong, the last: %w", settleRetries, wrong)
}

// listedOnce lists the snapshots and says what is wrong with the list.
func (w *world) listedOnce() error {
	ctx, cancel := opContext()
	defer cancel()
	resp, err := w.co().ctl.ListSnapshots(ctx, &csispec.ListSnapshotsRequest{})
	w.tracef("co: ListSnapshots (settled): %d, %v", len(resp.GetEntries()), errText(err))
	if err != nil {
		return fmt.Errorf("ListSnapshots: %w", err)
	}
	listed := map[string]int{}
	for _, e := range resp.GetEntries() {
		listed[e.GetSnapshot().GetSnapshotId()]++
	}
	for _, s := range w.snaps {
		if n := listed[s.id]; n != 1 && !(s.deleteTried && n == 0) {
			return fmt.Errorf("ListSnapshots lists snapshot %s of volume %s %d times, want once", s.name, s.volume, n)
		}
	}
	for _, s := range w.deletedSnaps {
		if listed[s.id] != 0 {
			return fmt.Errorf("ListSnapshots lists snapshot %s, deleted earlier", s.name)
		}
	}
	return nil
}

// settleRetries bounds the calls settle makes before it counts a call
// that keeps failing with every node up as a broken S2: the network still
// loses messages now and then.
const settleRetries = 10

// restoreSettled restores a volume from one of the snapshots the CO holds
// (whose deletion was never tried).
func (w *world) restoreSettled() error {
	var kept []*simSnapshot
	for _, s := range w.snaps {
		if !s.deleteTried {
			kept = append(kept, s)
		}
	}
	if len(kept) == 0 {
		return nil
	}
	s := kept[w.dice.intn(len(kept))]
	var err error
	for range settleRetries {
		if err = w.settleStep(); err != nil {
			return err
		}
		ctx, cancel := opContext()
		_, err = w.co().ctl.CreateVolume(ctx, &csispec.CreateVolumeRequest{Name: "settled-from-" + s.name, VolumeCapabilities: []*csispec.VolumeCapability{mountCapability},
			VolumeContentSource: &csispec.VolumeContentSource{Type: &csispec.VolumeContentSource_Snapshot{Snapshot: &csispec.VolumeContentSource_SnapshotSource{SnapshotId: s.id}}}})
		cancel()
		w.tracef("co: CreateVolume from snapshot %s (settled): %v", s.name, errText(err))
		if err == nil {
			w.stats.SettledRestores++
			return nil
		}
	}
	return fmt.Errorf("S2 broken: with every node up, no volume could be restored from snapshot %s of volume %s (%d tries), last: %v", s.name, s.volume, settleRetries, err)
}

// settleStep is a step of the world without an action or a fault.
func (w *world) settleStep() error {
	w.step++
	w.stepNow.Store(int64(w.step))
	return w.advance(nil)
}

// finishDeletions is the controller's pass over the snapshots deleted
// while a node was away (provision.FinishDeletions, every minute in
// zfs-controller), in the instance that holds the work lease.
func (w *world) finishDeletions() {
	ctx, cancel := opContext()
	defer cancel()
	for _, c := range w.holders() {
		err := c.deletions.FinishDeletions(ctx)
		w.tracef("%s: finish snapshot deletions: %v", c.endpoint, errText(err))
	}
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
	resp, err := w.co().ctl.ListSnapshots(ctx, &csispec.ListSnapshotsRequest{})
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
	_, err = w.co().ctl.CreateVolume(ctx, &csispec.CreateVolumeRequest{Name: "from-" + d.name, VolumeCapabilities: []*csispec.VolumeCapability{mountCapability},
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
	_, err := w.co().ctl.CreateVolume(ctx, &csispec.CreateVolumeRequest{Name: v.name, VolumeCapabilities: []*csispec.VolumeCapability{mountCapability},
		Parameters:          map[string]string{contract.ParamReplicas: "1", contract.ParamFailover: contract.FailoverAuto},
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
	_, err := w.co().ctl.ControllerExpandVolume(ctx, &csispec.ControllerExpandVolumeRequest{VolumeId: v.id, CapacityRange: &csispec.CapacityRange{RequiredBytes: size}})
	w.tracef("co: ControllerExpandVolume %s to %d GiB: %v", v.name, size>>30, errText(err))
	if err == nil {
		w.stats.Expands++
	}
}
