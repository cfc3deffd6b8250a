package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// Replacing a replica (docs/replication.md, "Replacing a replica").
//
// A full stream for a volume of which this node holds a replica of an
// older generation is received beside it, as <id>-incoming, and only a
// complete one takes the replica's place: a transfer that breaks leaves
// the old replica as it was (I2). The steps, each of which a crash may
// follow:
//
//  1. zfs receive into <id>-incoming, without the role label: a partial
//     or unlabelled incoming copy is nobody's replica, and is destroyed
//     when found.
//  2. Label it a replica: from now on it is complete.
//  3. Destroy the old replica when it holds no snapshot. Otherwise set
//     it aside: it may hold writes the new primary lacks (I4), and only
//     the sender's header would say otherwise (retire).
//  4. Rename <id>-incoming to <id>.
//
// finishReplace completes steps 3 and 4 for a labelled incoming copy, and
// runs before every receive of the volume and when the node starts.

const incomingSuffix = "-incoming"

func incomingName(fs string) string { return fs + incomingSuffix }

// replace puts the complete incoming copy in the place of the replica at
// fs. The caller holds the volume's lock.
func (r *Receiver) replace(ctx context.Context, fs, incoming string, labels map[string]string, log hclog.Logger) error {
	if err := r.z.SetProperties(ctx, incoming, labels); err != nil {
		r.dropIncoming(ctx, incoming, log)
		return fmt.Errorf("labelling the received replacement %s: %w", incoming, err)
	}
	return r.finishReplace(ctx, fs, log)
}

// finishReplace completes or discards a replacement a receive left at
// incomingName(fs): a complete one takes fs's place, a partial one is
// destroyed (the source still has all of it). The caller holds the
// volume's lock.
func (r *Receiver) finishReplace(ctx context.Context, fs string, log hclog.Logger) error {
	incoming := incomingName(fs)
	role, err := r.z.Property(ctx, incoming, copyrecord.PropRole)
	if errors.Is(err, zfs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the replacement %s: %w", incoming, err)
	}
	if role != RoleReplica || r.replicas.HasPartial(ctx, incoming) {
		log.Info("discarding an incomplete replacement", "dataset", incoming)
		return r.destroyIncoming(ctx, incoming)
	}
	state, err := r.copyState(ctx, fs)
	if err != nil {
		return err
	}
	switch {
	case state.Exists && state.Role != RoleReplica:
		// The copy became something else meanwhile (promoted by a
		// failover): the replacement is kept, not destroyed, for an
		// operator.
		log.Warn("the replica was promoted while its replacement arrived: setting the replacement aside", "dataset", incoming)
		return r.setAside(ctx, incoming, fs, log)
	case state.Exists:
		if err := r.retire(ctx, fs, incoming, state.Generation, log); err != nil {
			return err
		}
	}
	if err := r.z.Rename(ctx, incoming, fs); err != nil {
		return fmt.Errorf("renaming the replacement %s to %s: %w", incoming, fs, err)
	}
	log.Info("replica replaced by a full stream of a newer generation", "generation", state.Generation)
	return nil
}

// retire removes the replica at fs, of generation, from its place before
// the complete replacement at incoming takes it. One without a snapshot
// holds nothing and is destroyed; any other is set aside: it may hold
// writes the new primary lacks (I4), or a CSI snapshot that exists
// nowhere else (its CSI snapshots stay listed there).
//
// A replica whose generation the replacement's history holds
// (history_from <= generation < the new generation: planned moves since)
// is set aside too, not destroyed: both numbers are labels the receiver
// set from the sender's header, and the replacement shares no snapshot
// with the replica (or it would have been an incremental), so nothing
// this node holds confirms them, and a peer's word must not destroy a
// copy that may be the only one of its writes. The cost is a set-aside
// copy, for an operator, where a planned move's replica missed its
// bridges (rare: docs/replication.md, "Replicas share a base").
func (r *Receiver) retire(ctx context.Context, fs, incoming string, generation uint64, log hclog.Logger) error {
	snaps, err := r.z.Snapshots(ctx, fs)
	if err != nil {
		return fmt.Errorf("listing the snapshots of the replica being replaced, %s: %w", fs, err)
	}
	if len(snaps) == 0 {
		return r.replicas.DestroyReplica(ctx, fs)
	}
	lacking, err := r.csiSnapshotsLacking(ctx, snaps, incoming)
	if err != nil {
		return err
	}
	labels, err := r.z.Properties(ctx, incoming, copyrecord.PropGeneration, copyrecord.PropHistoryFrom)
	if err != nil {
		return fmt.Errorf("reading the labels of the replacement %s: %w", incoming, err)
	}
	log.Info("the replaced replica shares no snapshot with its replacement; only the sender's header says it holds nothing more: setting it aside",
		"replica_generation", generation, "generation", labels[copyrecord.PropGeneration], "history_from", labels[copyrecord.PropHistoryFrom], "csi_snapshot_lacking", lacking)
	return r.setAside(ctx, fs, fs, log)
}

// csiSnapshotsLacking returns the name of a live CSI snapshot among snaps
// that other lacks (by GUID), or "" when other has every one.
func (r *Receiver) csiSnapshotsLacking(ctx context.Context, snaps []zfs.Snap, other string) (string, error) {
	if !slices.ContainsFunc(snaps, copyrecord.IsLiveCSISnapshot) {
		return "", nil
	}
	theirs, err := r.z.Snapshots(ctx, other)
	if err != nil {
		return "", fmt.Errorf("listing the snapshots of %s: %w", other, err)
	}
	has := map[uint64]bool{}
	for _, s := range theirs {
		has[s.GUID] = true
	}
	for _, s := range snaps {
		if copyrecord.IsLiveCSISnapshot(s) && !has[s.GUID] {
			return s.Name, nil
		}
	}
	return "", nil
}

// setAside renames the copy at name aside as a set-aside copy of the
// volume at fs: never mounted, never listed as a replica, kept until an
// operator removes it (docs/migration.md). Its holds are released, or
// the operator's zfs destroy would fail.
func (r *Receiver) setAside(ctx context.Context, name, fs string, log hclog.Logger) error {
	now := time.Now()
	props := copyrecord.SetAsideLabels(now)
	if err := r.z.SetProperties(ctx, name, props); err != nil {
		return fmt.Errorf("setting %s aside: %w", name, err)
	}
	aside := copyrecord.AsideName(fs, now)
	if err := r.z.Rename(ctx, name, aside); err != nil {
		return fmt.Errorf("renaming %s aside to %s: %w", name, aside, err)
	}
	if err := copyrecord.ReleaseHolds(ctx, r.z, aside, func(string) bool { return true }); err != nil {
		log.Warn("releasing the set-aside copy's holds failed; zfs release them before destroying it", "dataset", aside, "error", err)
	}
	log.Warn("replica set aside: it may hold snapshots the new primary lacks; an operator decides what to keep", "dataset", aside)
	return nil
}

// destroyIncoming destroys an incoming copy with any partial receive.
func (r *Receiver) destroyIncoming(ctx context.Context, incoming string) error {
	if err := r.replicas.AbortPartial(ctx, incoming); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		return err
	}
	if err := r.z.DestroyRecursive(ctx, incoming); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		return err
	}
	return nil
}

// dropIncoming destroys a replacement whose transfer failed; what fails
// here is retried before the next receive of the volume.
func (r *Receiver) dropIncoming(ctx context.Context, incoming string, log hclog.Logger) {
	if err := r.destroyIncoming(context.WithoutCancel(ctx), incoming); err != nil {
		log.Warn("discarding the broken replacement failed; the next receive retries", "dataset", incoming, "error", err)
	}
}

// Recover finishes or discards the replacements a crash interrupted, then
// finishes the base holds of receives whose tidy a stop cut off
// (holdNewestBases). The node runs it once before serving.
func (r *Receiver) Recover(ctx context.Context) error {
	children, err := r.z.ChildProperties(ctx, r.root, copyrecord.PropRole)
	if err != nil {
		return fmt.Errorf("listing %s: %w", r.root, err)
	}
	for _, ch := range children {
		fs, ok := strings.CutSuffix(ch.Name, incomingSuffix)
		id := fs[strings.LastIndexByte(fs, '/')+1:]
		if !ok || !contract.IsVolumeID(id) {
			continue
		}
		if err := r.recoverOne(ctx, id, fs); err != nil {
			return err
		}
	}
	return r.holdNewestBases(ctx)
}

func (r *Receiver) recoverOne(ctx context.Context, id, fs string) error {
	unlock, err := r.locks.Lock(ctx, id, "finishing a replacement")
	if err != nil {
		return err
	}
	defer unlock()
	if err := r.finishReplace(ctx, fs, r.log.With("volume_id", id)); err != nil {
		return fmt.Errorf("finishing the replacement of volume %s: %w", id, err)
	}
	return nil
}
