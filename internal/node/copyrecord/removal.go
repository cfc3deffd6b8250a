package copyrecord

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Surplus, given to RemoveReplica, removes the replica only as a surplus
// copy (docs/replication.md, "Surplus copies"): a replica demoted from
// primary after a move, whose newest snapshot is still Newest (the one
// the schedule judged it by: a push since may have made it the freshest
// copy), with no receive waiting to resume, and holding no snapshot but
// the driver's replication snapshots and the CSI snapshots in Elsewhere
// (found on the volume's primary and kept replicas: any other, or one
// made by hand, would go with it).
type Surplus struct {
	Newest    string
	Elsewhere []string
}

// Removal says what RemoveReplica did.
type Removal struct {
	// Dataset is the replica's dataset; "" when the node held no
	// replica, and nothing was done.
	Dataset string
	// Tombstone is the name the replica took to keep its CSI snapshots;
	// "" when it was destroyed.
	Tombstone string
}

// RemoveReplica removes this node's replica of volumeID, if it holds
// one; a primary is never touched. A replica holding CSI snapshots
// becomes a tombstone, as a deleted primary does (docs/volumes.md,
// "Deleting"): a CSI snapshot outlives its volume and every copy of it,
// and removing a replica never destroys one (docs/replication.md, "CSI
// snapshots"). Any other replica is destroyed with its snapshots, holds
// and partial receive. With surplus set, a replica that is not a surplus
// copy is FailedPrecondition, and nothing changes. The caller holds the
// volume's lock.
func (r *Replicas) RemoveReplica(ctx context.Context, volumeID string, surplus *Surplus) (Removal, error) {
	fs, props, ok, err := r.readReplica(ctx, volumeID)
	if !ok || err != nil {
		return Removal{}, err
	}
	snaps, err := r.store.Snapshots(ctx, fs)
	if err != nil {
		return Removal{}, fmt.Errorf("listing the snapshots of replica %s: %w", fs, err)
	}
	if surplus != nil {
		if err := checkSurplus(props, snaps, *surplus); err != nil {
			return Removal{}, fmt.Errorf("%w: it is kept: %v", errdefs.ErrFailedPrecondition, err)
		}
	}
	if !slices.ContainsFunc(snaps, IsLiveCSISnapshot) {
		if err := r.DestroyReplica(ctx, fs); err != nil {
			return Removal{}, err
		}
		return Removal{Dataset: fs}, nil
	}
	tombstone, err := r.entomb(ctx, fs)
	if err != nil {
		return Removal{}, err
	}
	return Removal{Dataset: fs, Tombstone: tombstone}, nil
}

// checkSurplus says why the replica with props and snaps (oldest first)
// is not the surplus copy s describes, or nil when it is one.
func checkSurplus(props map[string]string, snaps []zfs.Snap, s Surplus) error {
	if DemotedAt(props[PropDemotedAt]).IsZero() {
		return errors.New("it was not demoted from primary by a move")
	}
	if token := props["receive_resume_token"]; token != "" && token != "-" {
		return errors.New("an interrupted receive into it waits to be resumed")
	}
	if len(snaps) == 0 || ShortSnapshotName(snaps[len(snaps)-1].Name) != s.Newest {
		return fmt.Errorf("its newest snapshot is no longer %s", s.Newest)
	}
	for _, snap := range snaps {
		name := ShortSnapshotName(snap.Name)
		if !strings.HasPrefix(name, contract.ReplicationSnapshotPrefix) && !(IsLiveCSISnapshot(snap) && slices.Contains(s.Elsewhere, name)) {
			return fmt.Errorf("it holds snapshot %s, which is not a replication snapshot and may exist nowhere else", name)
		}
	}
	return nil
}

// entomb turns replica fs into a tombstone: any partial receive, its
// holds and its replication snapshots go; it is labelled deleted and
// renamed TombstoneName(fs, now). The node collects it once its last CSI
// snapshot is deleted (volume.Manager).
func (r *Replicas) entomb(ctx context.Context, fs string) (string, error) {
	if err := r.dropReceiveAndHolds(ctx, fs); err != nil {
		return "", err
	}
	if err := Prune(ctx, r.store, fs, 0); err != nil {
		return "", err
	}
	now := time.Now()
	if err := r.store.SetProperties(ctx, fs, TombstoneLabels(now)); err != nil {
		return "", fmt.Errorf("marking replica %s deleted: %w", fs, err)
	}
	tombstone := TombstoneName(fs, now)
	if err := r.store.Rename(ctx, fs, tombstone); err != nil {
		return "", fmt.Errorf("renaming the deleted replica %s to %s: %w", fs, tombstone, err)
	}
	return tombstone, nil
}

// DestroyReplica destroys replica fs with its snapshots, holds and any
// partial receive. The caller holds the volume's lock and checked that
// fs is a replica.
func (r *Replicas) DestroyReplica(ctx context.Context, fs string) error {
	if err := r.dropReceiveAndHolds(ctx, fs); err != nil {
		return err
	}
	if err := r.store.DestroyRecursive(ctx, fs); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		return err
	}
	return nil
}

// dropReceiveAndHolds discards a partial receive into replica fs and
// releases every hold on its snapshots: what a replica keeps that no
// removal may leave behind.
func (r *Replicas) dropReceiveAndHolds(ctx context.Context, fs string) error {
	if err := r.AbortPartial(ctx, fs); err != nil {
		return err
	}
	return ReleaseHolds(ctx, r.store, fs, func(string) bool { return true })
}

// AbortPartial discards the interrupted receive into fs, if one waits.
func (r *Replicas) AbortPartial(ctx context.Context, fs string) error {
	if r.HasPartial(ctx, fs) {
		return r.store.AbortReceive(ctx, fs)
	}
	return nil
}

// HasPartial reports whether an interrupted receive into fs waits; one
// that cannot be read counts as none.
func (r *Replicas) HasPartial(ctx context.Context, fs string) bool {
	partial, err := r.Partial(ctx, fs)
	return err == nil && partial
}

// Partial reports whether an interrupted receive into fs waits (its
// resume token), or the error that kept it from reading it; fs gone is
// none.
func (r *Replicas) Partial(ctx context.Context, fs string) (bool, error) {
	token, err := r.store.Property(ctx, fs, "receive_resume_token")
	if errors.Is(err, zfs.ErrNotFound) {
		return false, nil
	}
	return err == nil && token != "-" && token != "", err
}

// DiscardPartial discards an interrupted receive into this node's replica
// of volumeID, before it is promoted (volume.Manager.Promote, which holds
// the volume's lock, so no receive can start until the promotion is
// done: a receive that finished on the promoted copy would label it a
// replica of the older generation again, I3). A primary is left alone.
func (r *Replicas) DiscardPartial(ctx context.Context, volumeID string) error {
	if !contract.IsVolumeID(volumeID) {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "%q is not a volume ID", volumeID)
	}
	fs := r.root + "/" + volumeID
	if !r.HasPartial(ctx, fs) {
		return nil
	}
	if role, err := r.store.Property(ctx, fs, PropRole); err != nil || role != contract.RoleReplica {
		return nil
	}
	if err := r.store.AbortReceive(ctx, fs); err != nil {
		return fmt.Errorf("discarding the partial receive into %s before promoting it: %w", fs, err)
	}
	return nil
}

// BaseHoldTag holds the newest snapshot both sides of a replication
// share: a receiver holds its newest received snapshot with it, a sender
// the base of each peer with PeerBaseTag (docs/replication.md).
const BaseHoldTag = "zfs-nomad-base"

// PeerBaseTag is the hold tag of node's base on a primary.
func PeerBaseTag(node string) string { return BaseHoldTag + "-" + node }

// PeerStreamedTag is the hold tag, on a primary, of the first replication
// snapshot streamed to node while no snapshot here carried a tag of
// node's: node may hold it, or a later one, unbeknown to a restarted
// process (docs/replication.md, "A replica is never ahead of its
// primary's snapshots").
func PeerStreamedTag(node string) string { return "zfs-nomad-streamed-" + node }

// ReleaseHolds releases, on every snapshot of fs, the hold tags drop
// selects. A copy that changed roles keeps no holds of its old role.
// Here and in the other bookkeeping, a snapshot that vanished since the
// listing (destroyed by a delete or a concurrent prune) is done with.
func ReleaseHolds(ctx context.Context, store Store, fs string, drop func(tag string) bool) error {
	holds, err := store.Holds(ctx, fs)
	if err != nil {
		return fmt.Errorf("listing holds on %s: %w", fs, err)
	}
	for snap, tags := range holds {
		for _, t := range tags {
			if drop(t) {
				if err := store.Release(ctx, snap, t); err != nil && !errors.Is(err, zfs.ErrNotFound) {
					return fmt.Errorf("releasing %s on %s: %w", t, snap, err)
				}
			}
		}
	}
	return nil
}

// Prune destroys the replication snapshots of fs beyond the newest keep
// that carry no hold and are not in spare. Replication's bases are held
// or spared, so they always stay.
func Prune(ctx context.Context, store Store, fs string, keep int, spare ...string) error {
	snaps, err := store.Snapshots(ctx, fs)
	if err != nil {
		return err
	}
	holds, err := store.Holds(ctx, fs)
	if err != nil {
		return err
	}
	var ours []string
	for _, s := range snaps { // oldest first
		if strings.HasPrefix(ShortSnapshotName(s.Name), contract.ReplicationSnapshotPrefix) {
			ours = append(ours, s.Name)
		}
	}
	for i, name := range ours {
		if i >= len(ours)-keep || len(holds[name]) > 0 || slices.Contains(spare, name) {
			continue
		}
		if err := store.DestroySnapshot(ctx, name); err != nil && !errors.Is(err, zfs.ErrNotFound) {
			return fmt.Errorf("pruning %s: %w", name, err)
		}
	}
	return nil
}
