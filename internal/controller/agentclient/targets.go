package agentclient

import (
	"context"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/connpool"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// Backup is one backup on a backup target (docs/backups.md).
type Backup struct {
	Target, VolumeID, VolumeName, Snapshot string
	Received                               time.Time
	ReferencedBytes, CapacityBytes         uint64
	Parameters                             map[string]string
	Encrypted                              bool
	// CurrentChain: in the volume's current chain, not an earlier one.
	CurrentChain bool
}

// NewestByVolume is, by volume ID, when the newest of backups was
// received: what a volume's backup age counts from.
func NewestByVolume(backups []Backup) map[string]time.Time {
	newest := map[string]time.Time{}
	for _, b := range backups {
		if b.Received.After(newest[b.VolumeID]) {
			newest[b.VolumeID] = b.Received
		}
	}
	return newest
}

// Ref is the backup's reference; its SnapshotID is what a restore names.
func (b Backup) Ref() contract.BackupRef {
	return contract.BackupRef{Target: b.Target, VolumeID: b.VolumeID, Snapshot: b.Snapshot}
}

// Targets reaches the backup targets by name (the configuration's
// backup_targets), over one connection per target held to its name: every
// answer must come from the target's certificate.
type Targets struct {
	addrs map[string]string
	conns *connpool.Pool
}

// NewTargets returns the targets at addrs (name to host:port), dialled
// with dial (tlsconfig's BackupDialOptions).
func NewTargets(addrs map[string]string, dial func(addr string) (*grpc.ClientConn, error)) *Targets {
	return &Targets{addrs: addrs, conns: connpool.New(dial)}
}

// Addr is target's address in backup_targets ("" for none).
func (t *Targets) Addr(target string) string { return t.addrs[target] }

// Names are the targets' names, sorted.
func (t *Targets) Names() []string { return slices.Sorted(maps.Keys(t.addrs)) }

// Close closes the connections.
func (t *Targets) Close() { t.conns.Close() }

func (t *Targets) client(target string) (pb.BackupsClient, error) {
	addr, ok := t.addrs[target]
	if !ok {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, "no backup target %q in backup_targets (docs/backups.md)", target)
	}
	conn, err := t.conns.Get(addr)
	if err != nil {
		return nil, err
	}
	return pb.NewBackupsClient(tlsconfig.Bind(conn, target)), nil
}

// Backups lists target's backups of volumeID (every volume's for "").
func (t *Targets) Backups(ctx context.Context, target, volumeID string) ([]Backup, error) {
	c, err := t.client(target)
	if err != nil {
		return nil, err
	}
	resp, err := c.ListBackups(ctx, &pb.ListBackupsRequest{VolumeId: volumeID})
	if err != nil {
		return nil, fromStatus(err)
	}
	out := make([]Backup, 0, len(resp.GetBackups()))
	for _, b := range resp.GetBackups() {
		out = append(out, Backup{Target: target, VolumeID: b.GetVolumeId(), VolumeName: b.GetVolumeName(), Snapshot: b.GetSnapshot(),
			Received: time.Unix(b.GetReceivedUnix(), 0), ReferencedBytes: b.GetReferencedBytes(), CapacityBytes: b.GetCapacityBytes(),
			Parameters: b.GetParameters(), Encrypted: b.GetEncrypted(), CurrentChain: b.GetCurrentChain()})
	}
	return out, nil
}

// Backup finds the backup ref names.
func (t *Targets) Backup(ctx context.Context, ref contract.BackupRef) (Backup, error) {
	all, err := t.Backups(ctx, ref.Target, ref.VolumeID)
	if err != nil {
		return Backup{}, err
	}
	for _, b := range all {
		if b.Snapshot == ref.Snapshot {
			return b, nil
		}
	}
	return Backup{}, errdefs.Wrap(errdefs.ErrNotFound, "backup target %s holds no backup %s of volume %s", ref.Target, ref.Snapshot, ref.VolumeID)
}

// GrantRestore has the backup's target grant its restore to node nodeID,
// and returns the grant the node shows the target.
func (t *Targets) GrantRestore(ctx context.Context, ref contract.BackupRef, nodeID string) (string, error) {
	c, err := t.client(ref.Target)
	if err != nil {
		return "", err
	}
	resp, err := c.GrantRestore(ctx, &pb.GrantRestoreRequest{VolumeId: ref.VolumeID, Snapshot: ref.Snapshot, NodeId: nodeID})
	if err != nil {
		return "", fromStatus(err)
	}
	return resp.GetGrant(), nil
}

// DeleteBackups has target destroy one backup of volumeID, or every
// backup of it when snapshot is empty (an operator's certificate only),
// and returns what it destroyed.
func (t *Targets) DeleteBackups(ctx context.Context, target, volumeID, snapshot string) ([]string, error) {
	c, err := t.client(target)
	if err != nil {
		return nil, err
	}
	resp, err := c.DeleteBackups(ctx, &pb.DeleteBackupsRequest{VolumeId: volumeID, Snapshot: snapshot})
	if err != nil {
		return nil, fromStatus(err)
	}
	return resp.GetDeleted(), nil
}
