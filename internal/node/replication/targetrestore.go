package replication

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A restore (docs/backups.md, "Restoring"): the controller has the target
// grant one backup's restore to one node (GrantRestore), and that node
// fetches it showing the grant (SendBackup), receiving it into a new
// volume. A grant names the backup and the node, and lasts GrantTTL: a
// node's certificate alone fetches no backup, and a grant shown by
// another node is refused.

// GrantTTL is how long a restore's grant may be used: a CreateVolume's
// retry after it asks for a new one.
const GrantTTL = 10 * time.Minute

// Backup is one backup on a target, as listed and as a restore's stream
// begins.
type Backup struct {
	VolumeID, VolumeName, Snapshot string
	Received                       time.Time
	Referenced, Capacity           uint64
	Parameters                     map[string]string
	Encrypted                      bool
	// Current: in the volume's current chain, not an earlier one.
	Current bool
	// name is the snapshot's full name on the target.
	name string
}

// restoreGrant is what a grant allows: one node to fetch one backup until
// expires.
type restoreGrant struct {
	volumeID, snapshot, node string
	expires                  time.Time
}

// grants are a target's restore grants, by token.
type grants struct {
	mu sync.Mutex
	by map[string]restoreGrant
}

// Backups lists the target's backups of volumeID (every volume's for ""),
// each volume's oldest first, its earlier chains before its current one.
func (t *TargetReceiver) Backups(ctx context.Context, volumeID string) ([]Backup, error) {
	if volumeID != "" && !contract.IsVolumeID(volumeID) {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "%q is not a volume ID", volumeID)
	}
	children, err := t.z.ChildProperties(ctx, t.root, copyrecord.PropRole, copyrecord.PropVolumeID)
	if err != nil {
		return nil, err
	}
	var out []Backup
	for _, c := range children {
		id := c.Props[copyrecord.PropVolumeID]
		if c.Props[copyrecord.PropRole] != contract.RoleBackup || (volumeID != "" && id != volumeID) {
			continue
		}
		found, err := t.chainBackups(ctx, c.Name, id)
		if err != nil {
			return nil, err
		}
		out = append(out, found...)
	}
	return out, nil
}

// chainBackups lists the backups of one chain of volume id.
func (t *TargetReceiver) chainBackups(ctx context.Context, chain, id string) ([]Backup, error) {
	props, err := t.z.Properties(ctx, chain, copyrecord.PropName, copyrecord.PropParameters, copyrecord.PropCapacity, "encryption")
	if err != nil {
		return nil, err
	}
	found, err := t.backups(ctx, chain)
	if err != nil {
		return nil, err
	}
	capacity, _ := strconv.ParseUint(props[copyrecord.PropCapacity], 10, 64)
	out := make([]Backup, 0, len(found))
	for _, b := range found {
		referenced, _ := t.z.Property(ctx, b.snap, "referenced")
		size, _ := strconv.ParseUint(referenced, 10, 64)
		out = append(out, Backup{VolumeID: id, VolumeName: props[copyrecord.PropName], Snapshot: copyrecord.ShortSnapshotName(b.snap),
			Received: b.received, Referenced: size, Capacity: capacity,
			Parameters: copyrecord.DecodeParameters(props[copyrecord.PropParameters]),
			Encrypted:  props["encryption"] != "off" && props["encryption"] != "-" && props["encryption"] != "",
			Current:    !strings.Contains(chain, chainInfix), name: b.snap})
	}
	return out, nil
}

// backup finds one backup of volumeID by its snapshot's short name, in
// any of the volume's chains.
func (t *TargetReceiver) backup(ctx context.Context, volumeID, snapshot string) (Backup, error) {
	if !contract.IsVolumeID(volumeID) {
		return Backup{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "%q is not a volume ID", volumeID)
	}
	all, err := t.Backups(ctx, volumeID)
	if err != nil {
		return Backup{}, err
	}
	for _, b := range all {
		if b.Snapshot == snapshot {
			return b, nil
		}
	}
	return Backup{}, errdefs.Wrap(errdefs.ErrNotFound, "backup target %s holds no backup %s of volume %s (zfs-controller backups lists them)", t.name, snapshot, volumeID)
}

// GrantRestore lets node nodeID fetch one backup for GrantTTL and returns
// the grant it shows.
func (t *TargetReceiver) GrantRestore(ctx context.Context, volumeID, snapshot, nodeID string) (string, time.Time, error) {
	if !contract.IsNodeID(nodeID) {
		return "", time.Time{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "%q is not a node ID", nodeID)
	}
	if _, err := t.backup(ctx, volumeID, snapshot); err != nil {
		return "", time.Time{}, err
	}
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		return "", time.Time{}, err
	}
	token, now := hex.EncodeToString(raw), t.now()
	g := restoreGrant{volumeID: volumeID, snapshot: snapshot, node: nodeID, expires: now.Add(GrantTTL)}
	t.grants.mu.Lock()
	defer t.grants.mu.Unlock()
	if t.grants.by == nil {
		t.grants.by = map[string]restoreGrant{}
	}
	for k, old := range t.grants.by {
		if now.After(old.expires) {
			delete(t.grants.by, k)
		}
	}
	t.grants.by[token] = g
	t.log.Info("restore granted", "volume_id", volumeID, "snapshot", snapshot, "node_id", nodeID, "expires", g.expires.UTC().Format(time.RFC3339))
	return token, g.expires, nil
}

// checkGrant says whether grant lets caller (the node its verified
// certificate names; "" without TLS) fetch the backup.
func (t *TargetReceiver) checkGrant(token, caller, volumeID, snapshot string) error {
	t.grants.mu.Lock()
	g, ok := t.grants.by[token]
	t.grants.mu.Unlock()
	switch {
	case !ok || t.now().After(g.expires):
		return errdefs.Wrap(errdefs.ErrPermissionDenied, "no grant of a restore of volume %s on backup target %s (or it expired): the controller asks for one at each restore", volumeID, t.name)
	case g.volumeID != volumeID || g.snapshot != snapshot:
		return errdefs.Wrap(errdefs.ErrPermissionDenied, "the grant is for backup %s of volume %s, not %s of %s", g.snapshot, g.volumeID, snapshot, volumeID)
	case caller != "" && caller != g.node:
		return errdefs.Wrap(errdefs.ErrPermissionDenied, "the grant is for node %s, not %s", g.node, caller)
	}
	return nil
}

// SendBackup sends a node that shows a grant the backup's header and then
// its raw stream, whole, in messages of chunkSize (send).
func (t *TargetReceiver) SendBackup(ctx context.Context, caller, volumeID, snapshot, grant string, header func(Backup) error, send func([]byte) error) error {
	if err := t.checkGrant(grant, caller, volumeID, snapshot); err != nil {
		return err
	}
	b, err := t.backup(ctx, volumeID, snapshot)
	if err != nil {
		return err
	}
	if err := header(b); err != nil {
		return err
	}
	log := t.log.With("volume_id", volumeID, "volume_name", b.VolumeName, "snapshot", snapshot, "node_id", caller)
	log.Info("sending a backup for a restore")
	w := newChunkWriter(send, new(atomic.Int64))
	n, err := t.z.Send(ctx, zfs.SendSpec{Snapshot: b.name, Raw: true}, w)
	if err == nil {
		err = w.flush()
	}
	w.stop() // no send outlives the call
	if err != nil {
		if errors.Is(err, zfs.ErrNotFound) {
			err = errdefs.Wrap(errdefs.ErrNotFound, "backup %s of volume %s was pruned meanwhile", snapshot, volumeID)
		}
		log.Warn("sending a backup failed", "bytes", n, "error", err)
		return err
	}
	log.Info("backup sent", "bytes", n)
	return nil
}

// DeleteBackups destroys, at an operator's explicit request, one backup
// of volumeID (its snapshot's short name), or every backup of it, in
// every chain, when snapshot is empty; it returns what it destroyed. A
// receive of the volume running is waited for (the volume's lock). A
// backup deleted that was the base of the next push makes that push a
// full one, which starts a new chain.
func (t *TargetReceiver) DeleteBackups(ctx context.Context, volumeID, snapshot string) ([]string, error) {
	all, err := t.Backups(ctx, volumeID)
	if err != nil {
		return nil, err
	}
	if volumeID == "" {
		return nil, errdefs.Wrap(errdefs.ErrInvalidArgument, "name the volume whose backups to delete")
	}
	unlock, err := t.locks.Lock(ctx, volumeID, "an operator's delete of backups")
	if err != nil {
		return nil, err
	}
	defer unlock()
	if snapshot == "" {
		return t.deleteChains(ctx, volumeID, all)
	}
	for _, b := range all {
		if b.Snapshot != snapshot {
			continue
		}
		if err := copyrecord.ReleaseHolds(ctx, t.z, zfs.Parent(b.name), func(string) bool { return true }); err != nil {
			return nil, err
		}
		if err := t.z.DestroySnapshot(ctx, b.name); err != nil {
			return nil, err
		}
		t.log.Info("backup deleted by an operator", "volume_id", volumeID, "snapshot", b.name)
		return []string{b.name}, nil
	}
	return nil, errdefs.Wrap(errdefs.ErrNotFound, "backup target %s holds no backup %s of volume %s", t.name, snapshot, volumeID)
}

// deleteChains destroys every chain of volumeID, whose backups are all.
func (t *TargetReceiver) deleteChains(ctx context.Context, volumeID string, all []Backup) ([]string, error) {
	if len(all) == 0 {
		return nil, errdefs.Wrap(errdefs.ErrNotFound, "backup target %s holds no backup of volume %s", t.name, volumeID)
	}
	chains, err := t.chains(ctx, volumeID)
	if err != nil {
		return nil, err
	}
	for _, chain := range chains {
		// A held snapshot (the next push's base) stops zfs destroy -r.
		err := copyrecord.ReleaseHolds(ctx, t.z, chain, func(string) bool { return true })
		if err == nil {
			err = t.z.DestroyRecursive(ctx, chain)
		}
		if err != nil && !errors.Is(err, zfs.ErrNotFound) {
			return nil, err
		}
	}
	var deleted []string
	for _, b := range all {
		deleted = append(deleted, b.name)
	}
	t.log.Info("every backup of a volume deleted by an operator", "volume_id", volumeID, "backups", len(deleted))
	return deleted, nil
}
