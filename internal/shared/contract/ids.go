package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// IDs are derived from CSI names so that a retried CreateVolume or
// CreateSnapshot finds the dataset of the first attempt by name alone, and
// so that nothing a job submitter types ever becomes part of a ZFS name.
var (
	volumeIDPattern   = regexp.MustCompile(`^vol-[0-9a-f]{20}$`)
	snapshotIDPattern = regexp.MustCompile(`^snap-[0-9a-f]{20}$`)
)

// VolumeIDForName returns the volume ID for a CSI volume name.
func VolumeIDForName(name string) string { return "vol-" + digest("volume", name) }

// SnapshotIDForName returns the snapshot ID for a CSI snapshot name.
func SnapshotIDForName(name string) string { return "snap-" + digest("snapshot", name) }

func digest(kind, name string) string {
	sum := sha256.Sum256([]byte(kind + "\x00" + name))
	return hex.EncodeToString(sum[:10])
}

// IsVolumeID reports whether id has the form of a volume ID. Anything else
// names no volume, and is never put into a ZFS name.
func IsVolumeID(id string) bool { return volumeIDPattern.MatchString(id) }

// IsSnapshotID reports whether id has the form of a snapshot ID.
func IsSnapshotID(id string) bool { return snapshotIDPattern.MatchString(id) }

// ValidateName checks a CSI name given at create.
func ValidateName(kind, name string) error {
	if name == "" {
		return fmt.Errorf("%w: %s name is required", errdefs.ErrInvalidArgument, kind)
	}
	if len(name) > 128 {
		return fmt.Errorf("%w: %s name is %d bytes, at most 128 are allowed", errdefs.ErrInvalidArgument, kind, len(name))
	}
	if strings.ContainsRune(name, 0) {
		return fmt.Errorf("%w: %s name contains a NUL byte", errdefs.ErrInvalidArgument, kind)
	}
	return nil
}

var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// IsNodeID tells whether id is a valid node ID: letters, digits, _ . -,
// at most 128, starting with a letter or digit.
func IsNodeID(id string) bool { return nodeIDPattern.MatchString(id) }

// DeletionHolder holds the generation a volume's delete reserves on every
// node before it removes any copy (docs/safety.md, "Deleting a volume").
// It is no node ID (those begin with a letter or digit), so no copy is
// ever promoted with it, and a node that promised it refuses every other
// reservation until the delete has the promise forgotten.
const DeletionHolder = "(deletion)"

// BackupRef names one backup on a backup target (docs/backups.md): the
// volume it is of and its snapshot there. Its snapshot ID,
// backup:TARGET:VOLUME-ID@SNAPSHOT, is what a CSI CreateVolume restores
// from (its volume content source).
type BackupRef struct {
	Target, VolumeID, Snapshot string
}

// backupPrefix starts every backup's snapshot ID.
const backupPrefix = "backup:"

// backupSnapshotPattern is a backup's short snapshot name on a target:
// a replication snapshot's (zn-<unix nanos>).
var backupSnapshotPattern = regexp.MustCompile(`^zn-[0-9]{1,19}$`)

// SnapshotID is the backup's snapshot ID.
func (r BackupRef) SnapshotID() string {
	return backupPrefix + r.Target + ":" + r.VolumeID + "@" + r.Snapshot
}

// ParseBackupID reads a backup's snapshot ID; ok is false for anything
// else, an ordinary snapshot ID included.
func ParseBackupID(id string) (ref BackupRef, ok bool) {
	rest, ok := strings.CutPrefix(id, backupPrefix)
	if !ok {
		return BackupRef{}, false
	}
	target, rest, ok1 := strings.Cut(rest, ":")
	volume, snap, ok2 := strings.Cut(rest, "@")
	ref = BackupRef{Target: target, VolumeID: volume, Snapshot: snap}
	if !ok1 || !ok2 || !IsNodeID(target) || !IsVolumeID(volume) || !backupSnapshotPattern.MatchString(snap) {
		return BackupRef{}, false
	}
	return ref, true
}

// IsBackupID reports whether id names a backup on a target.
func IsBackupID(id string) bool {
	_, ok := ParseBackupID(id)
	return ok
}
