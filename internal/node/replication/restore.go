package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TargetPeers reaches the backup targets: their receiving end for pushes
// (Peers), and their backups for restores.
type TargetPeers interface {
	Peers
	// Fetch asks the backup target named target, at addr, for one backup,
	// showing its grant, and returns the backup's header and its stream,
	// which ends with the backup.
	Fetch(ctx context.Context, addr, target, volumeID, snapshot, grant string) (Backup, io.Reader, error)
}

// Restore receives the backup ref, fetched with grant from a target this
// node's configuration names, into dataset, a new volume's, with props
// set by the receive. check sees the backup's header first and may refuse
// it before anything is received. The stream must be a plain full stream
// (no properties: a target chooses no mountpoint here). The backup's
// snapshot is destroyed once it is in: a restored volume starts with no
// snapshot, its backups staying on the target. A restore that fails
// leaves nothing of dataset.
func (p *Pusher) Restore(ctx context.Context, ref contract.BackupRef, grant, dataset string, props map[string]string,
	check func(encrypted bool, referenced uint64) error) error {
	addr, ok := p.targets[ref.Target]
	if !ok || p.targetPeers == nil {
		return errdefs.Wrap(errdefs.ErrNotFound, "node %s knows no backup target %q: add it to its backup_targets (docs/backups.md)", p.nodeID, ref.Target)
	}
	log := p.log.With("volume_id", ref.VolumeID, "backup_target", ref.Target, "snapshot", ref.Snapshot, "into", dataset)
	ctx, cancel := context.WithCancel(ctx) // ends the fetch on every return
	defer cancel()
	b, stream, err := p.targetPeers.Fetch(ctx, addr, ref.Target, ref.VolumeID, ref.Snapshot, grant)
	if err != nil {
		return fmt.Errorf("fetching backup %s: %w", ref.SnapshotID(), err)
	}
	if err := check(b.Encrypted, b.Referenced); err != nil {
		return err
	}
	head := make([]byte, beginRecordSize)
	if _, err := io.ReadFull(stream, head); err != nil {
		return errdefs.Wrap(errdefs.ErrUnavailable, "the stream of backup %s ended before its first record: %v", ref.SnapshotID(), err)
	}
	if err := checkBegin(head, KindFull); err != nil {
		return fmt.Errorf("the stream of backup %s: %w", ref.SnapshotID(), err)
	}
	log.Info("restoring a backup", "bytes", b.Referenced, "encrypted", b.Encrypted)
	if err := p.z.Receive(ctx, dataset, props, io.MultiReader(bytes.NewReader(head), stream)); err != nil {
		p.abandonRestore(dataset, log)
		return errdefs.Wrap(errdefs.ErrUnavailable, "receiving backup %s into %s: %v", ref.SnapshotID(), dataset, err)
	}
	if err := p.z.DestroySnapshot(ctx, dataset+"@"+ref.Snapshot); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		// The create's retry destroys it (volume.Manager.dropCopiedSnapshot).
		return fmt.Errorf("destroying the snapshot backup %s brought along: %w", ref.SnapshotID(), err)
	}
	log.Info("backup restored")
	return nil
}

// abandonRestore removes what a failed restore's receive left: a partial
// receive's state, or a dataset received whole before the failure.
func (p *Pusher) abandonRestore(dataset string, log interface{ Warn(string, ...any) }) {
	ctx, cancel := context.WithTimeout(context.Background(), tidyTimeout)
	defer cancel()
	if err := copyrecord.NewReplicas(p.z, p.root).AbortPartial(ctx, dataset); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		log.Warn("discarding a failed restore's partial receive failed", "error", err)
	}
	if err := p.z.DestroyRecursive(ctx, dataset); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		log.Warn("destroying a failed restore's dataset failed", "error", err)
	}
}
