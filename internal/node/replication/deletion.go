package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfscmd"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// DeleteReplica destroys this node's replica of volumeID with its snapshots
// and any partial receive; it reports whether there was one. A primary is
// never touched.
func (r *Receiver) DeleteReplica(ctx context.Context, volumeID string) (bool, error) {
	return r.deleteReplica(ctx, volumeID, "the replica", nil)
}

// DeleteSurplus destroys this node's replica of volumeID as a surplus
// copy (docs/replication.md, "Surplus copies"): only a replica demoted
// from primary after a move, whose newest snapshot is still newest (the
// one the schedule judged it by: a push since may have made it the
// freshest copy), with no receive waiting to resume, and holding no
// snapshot but the driver's replication snapshots and the CSI snapshots
// named in elsewhere (found on the volume's primary and kept replicas:
// any other, or one made by hand, would go with it). Anything else is
// FailedPrecondition, and nothing changes. It reports whether there was
// a replica.
func (r *Receiver) DeleteSurplus(ctx context.Context, volumeID, newest string, elsewhere []string) (bool, error) {
	return r.deleteReplica(ctx, volumeID, "a surplus replica", func(fs string, props map[string]string) error {
		if err := r.surplus(ctx, fs, props, newest, elsewhere); err != nil {
			return fmt.Errorf("%w: keeping node %s's replica of volume %s: %v", errdefs.ErrFailedPrecondition, r.nodeID, volumeID, err)
		}
		return nil
	})
}

// deleteReplica destroys this node's replica of volumeID (what it is, for
// the lock and the log), holding its lock, unless check (when set) says
// why not; it reports whether there was a replica.
func (r *Receiver) deleteReplica(ctx context.Context, volumeID, what string, check func(fs string, props map[string]string) error) (bool, error) {
	fs, err := dataset(r.root, volumeID)
	if err != nil {
		return false, nil // names no volume, so no replica of one
	}
	unlock, err := r.locks.Lock(ctx, volumeID, "deleting "+what)
	if err != nil {
		return false, err
	}
	defer unlock()
	props, err := r.z.GetAll(ctx, fs, holdingProps...)
	if errors.Is(err, zfs.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !r.isReplica(zfscmd.Child{Name: fs, Props: props}) {
		return false, nil
	}
	if check != nil {
		if err := check(fs, props); err != nil {
			return false, err
		}
	}
	entombed, err := r.removeReplica(ctx, fs)
	if err != nil {
		return false, err
	}
	if entombed != "" {
		r.log.Info("deleted "+what+"; its CSI snapshots stay on a tombstone until they are deleted", "volume_id", volumeID, "tombstone", entombed)
		return true, nil
	}
	r.log.Info("deleted "+what, "volume_id", volumeID, "dataset", fs)
	return true, nil
}

// removeReplica removes replica fs. One holding CSI snapshots becomes a
// tombstone, as a deleted primary does (docs/volumes.md, "Deleting"): a
// CSI snapshot outlives its volume and every copy of it, and removing a
// replica never destroys one (docs/replication.md, "CSI snapshots").
// It returns the tombstone's name, or "" when the replica was destroyed.
// The caller holds the volume's lock and checked the role.
func (r *Receiver) removeReplica(ctx context.Context, fs string) (string, error) {
	snaps, err := r.z.Snapshots(ctx, fs)
	if err != nil {
		return "", fmt.Errorf("listing the snapshots of replica %s: %w", fs, err)
	}
	if !slices.ContainsFunc(snaps, isLiveCSISnapshot) {
		return "", r.destroyReplica(ctx, fs)
	}
	return r.entomb(ctx, fs)
}

// entomb turns replica fs into a tombstone: any partial receive, its
// holds and (pruned with none kept) its replication snapshots go; it is
// labelled deleted and renamed <fs>-deleted-<nanos>. The node collects it
// once its last CSI snapshot is deleted (volume.Manager). Entombed, when
// set, learns its name.
func (r *Receiver) entomb(ctx context.Context, fs string) (string, error) {
	if err := r.abortPartial(ctx, fs); err != nil {
		return "", err
	}
	if err := releaseTags(ctx, r.z, fs, func(string) bool { return true }); err != nil {
		return "", err
	}
	if err := prune(ctx, r.z, fs, 0); err != nil {
		return "", err
	}
	now := time.Now()
	if err := r.z.Set(ctx, fs, map[string]string{copyrecord.PropRole: contract.RoleDeleted, copyrecord.PropDeletedAt: now.UTC().Format(time.RFC3339)}); err != nil {
		return "", fmt.Errorf("marking replica %s deleted: %w", fs, err)
	}
	tombstone := copyrecord.TombstoneName(fs, now)
	if err := r.z.Rename(ctx, fs, tombstone); err != nil {
		return "", fmt.Errorf("renaming the deleted replica %s to %s: %w", fs, tombstone, err)
	}
	if r.Entombed != nil {
		r.Entombed(tombstone)
	}
	return tombstone, nil
}

// surplus says why replica fs, with props, is not a surplus copy whose
// newest snapshot is newest, or nil when it is one.
func (r *Receiver) surplus(ctx context.Context, fs string, props map[string]string, newest string, elsewhere []string) error {
	if copyrecord.DemotedAt(props[copyrecord.PropDemotedAt]).IsZero() {
		return errors.New("it was not demoted from primary by a move")
	}
	if token := props["receive_resume_token"]; token != "" && token != "-" {
		return errors.New("an interrupted receive into it waits to be resumed")
	}
	snaps, err := r.z.Snapshots(ctx, fs)
	if err != nil {
		return err
	}
	if len(snaps) == 0 || shortSnapshotName(snaps[len(snaps)-1].Name) != newest {
		return fmt.Errorf("its newest snapshot is no longer %s", newest)
	}
	for _, snap := range snaps {
		name := shortSnapshotName(snap.Name)
		if !strings.HasPrefix(name, contract.ReplicationSnapshotPrefix) && !(isLiveCSISnapshot(snap) && slices.Contains(elsewhere, name)) {
			return fmt.Errorf("it holds snapshot %s, which is not a replication snapshot and may exist nowhere else", name)
		}
	}
	return nil
}

// destroyReplica destroys a replica with its snapshots, holds and any
// partial receive. The caller holds the volume's lock and checked the role.
func (r *Receiver) destroyReplica(ctx context.Context, fs string) error {
	if err := r.abortPartial(ctx, fs); err != nil {
		return err
	}
	if err := releaseTags(ctx, r.z, fs, func(string) bool { return true }); err != nil {
		return err
	}
	if err := r.z.DestroyRecursive(ctx, fs); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		return err
	}
	return nil
}

func (r *Receiver) abortPartial(ctx context.Context, fs string) error {
	if r.hasPartial(ctx, fs) {
		return r.z.AbortReceive(ctx, fs)
	}
	return nil
}

// hasPartial reports whether an interrupted receive into fs waits.
func (r *Receiver) hasPartial(ctx context.Context, fs string) bool {
	token, err := r.z.Get(ctx, fs, "receive_resume_token")
	return err == nil && token != "-" && token != ""
}

// DiscardPartial discards an interrupted receive into this node's replica
// of volumeID, before it is promoted (volume.Manager.Promote, which holds
// the volume's lock, so no receive can start until the promotion is
// done: a receive that finished on the promoted copy would label it a
// replica of the older generation again, I3). A primary is left alone.
func (r *Receiver) DiscardPartial(ctx context.Context, volumeID string) error {
	fs, err := dataset(r.root, volumeID)
	if err != nil {
		return err
	}
	if !r.hasPartial(ctx, fs) {
		return nil
	}
	if role, err := r.z.Get(ctx, fs, copyrecord.PropRole); err != nil || role != RoleReplica {
		return nil
	}
	if err := r.abortPartial(ctx, fs); err != nil {
		return fmt.Errorf("discarding the partial receive into %s before promoting it: %w", fs, err)
	}
	return nil
}
