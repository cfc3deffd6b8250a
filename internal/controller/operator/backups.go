package operator

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// BackupLister lists a backup target's backups (agentclient.Targets).
type BackupLister interface {
	Backups(ctx context.Context, target, volumeID string) ([]agentclient.Backup, error)
}

// ListBackups prints target's backups of the volume named volume (its
// name or ID; every volume's when empty), oldest first by volume, with
// the snapshot ID a restore names (docs/backups.md). A volume's backups
// outlive it: they are found by the name it had.
func ListBackups(ctx context.Context, targets BackupLister, target, volume string, out io.Writer) error {
	all, err := targets.Backups(ctx, target, "")
	if err != nil {
		return err
	}
	var shown []agentclient.Backup
	for _, b := range all {
		if volume == "" || b.VolumeID == volume || b.VolumeName == volume {
			shown = append(shown, b)
		}
	}
	if volume != "" && len(shown) == 0 {
		return errdefs.Wrap(errdefs.ErrNotFound, "backup target %s holds no backup of a volume named or with the ID %q", target, volume)
	}
	slices.SortFunc(shown, func(a, b agentclient.Backup) int {
		return cmp.Or(cmp.Compare(a.VolumeName, b.VolumeName), a.Received.Compare(b.Received), cmp.Compare(a.Snapshot, b.Snapshot))
	})
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "VOLUME\tRECEIVED\tSIZE\tCHAIN\tSNAPSHOT ID")
	for _, b := range shown {
		chain := "current"
		if !b.CurrentChain {
			chain = "earlier"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", b.VolumeName, b.Received.UTC().Format(time.RFC3339), contract.Bytes(int64(b.ReferencedBytes)), chain, b.Ref().SnapshotID())
	}
	return w.Flush()
}

// BackupDeleter deletes a target's backups (agentclient.Targets).
type BackupDeleter interface {
	DeleteBackups(ctx context.Context, target, volumeID, snapshot string) ([]string, error)
}

// DeleteBackups deletes, on target, the backup snapshot of the volume
// named volume (its name or ID: the volume may be deleted), or every
// backup of it when snapshot is empty, and says what went.
func DeleteBackups(ctx context.Context, targets BackupDeleter, target, volume, snapshot string, out io.Writer) error {
	id := volume
	if !contract.IsVolumeID(volume) {
		id = contract.VolumeIDForName(volume) // a volume's ID is its name's
	}
	deleted, err := targets.DeleteBackups(ctx, target, id, snapshot)
	if err != nil {
		return err
	}
	for _, name := range deleted {
		fmt.Fprintf(out, "deleted %s\n", name)
	}
	fmt.Fprintf(out, "%d backups of %s deleted from backup target %s\n", len(deleted), id, target)
	return nil
}
