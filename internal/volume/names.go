package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
)

// The user properties the driver owns in ZFS. They are the truth about every
// volume: the controller keeps no state and rebuilds its view from them.
const (
	propPrefix = "zfs-nomad:"
	// On volume filesystems.
	PropVolumeID   = propPrefix + "volume_id"  // the CSI volume ID; equals the dataset's last component
	PropName       = propPrefix + "name"       // the CSI name it was created with
	PropRole       = propPrefix + "role"       // RolePrimary or RoleDeleted (replicas come with replication)
	PropGeneration = propPrefix + "generation" // fencing token for migration; 1 at creation
	PropParameters = propPrefix + "parameters" // the creation parameters, canonical JSON
	PropSource     = propPrefix + "source"     // "snapshot:ID", "volume:ID" or ""
	PropDeletedAt  = propPrefix + "deleted_at" // RFC 3339 time a tombstone was deleted
	// Migration (docs/migration.md).
	PropMovingTo    = propPrefix + "moving_to"     // on a fenced primary: the node it moves to; "-" when none
	PropFencedAt    = propPrefix + "fenced_at"     // unix nanos the primary was fenced
	PropCapacity    = propPrefix + "capacity"      // on replicas: the primary's quota, applied at promotion
	PropFailoverLag = propPrefix + "failover_from" // on a primary promoted by failover: its newest snapshot then
	PropSetAsideAt  = propPrefix + "set_aside_at"  // on a copy set aside: when
	PropForced      = propPrefix + "forced"        // on a primary the operator promoted without a majority: its generation then
	// On a primary made read-only when its node lost its lease: unix
	// nanos then; "-" when lifted.
	PropLeaseFenced = propPrefix + "lease_fenced"
	// On primaries and replicas: the oldest generation whose every state
	// is in this copy's history (see HistoryFrom).
	PropHistoryFrom = propPrefix + "history_from"
	// On snapshots.
	PropSnapshotName = propPrefix + "snapshot_name" // the CSI name of a CSI snapshot
	PropSourceVolume = propPrefix + "source_volume" // the CSI volume ID it was taken of
)

// UserProperties lists every property the driver reads back from ZFS.
var UserProperties = []string{
	PropVolumeID, PropName, PropRole, PropGeneration, PropParameters, PropSource,
	PropDeletedAt, PropSnapshotName, PropSourceVolume,
	PropMovingTo, PropFencedAt, PropCapacity, PropFailoverLag, PropForced,
	PropHistoryFrom, PropLeaseFenced,
}

// HistoryFrom reads a copy's PropHistoryFrom: the oldest generation g such
// that every snapshot any primary of generations g up to the copy's own
// took is an earlier state of this copy. A planned move keeps it (the new
// primary holds the fenced primary's last state); a failover starts it
// afresh at the new generation (the lost primary may have written what
// the promoted replica lacks). A copy without the property, or with a
// value past its generation, answers its own generation: nothing older
// is vouched for.
func HistoryFrom(value string, generation uint64) uint64 {
	g, _ := strconv.ParseUint(value, 10, 64)
	return BoundHistoryFrom(g, generation)
}

// BoundHistoryFrom is g, or generation when g is unset (0) or past it.
func BoundHistoryFrom(g, generation uint64) uint64 {
	if g == 0 || g > generation {
		return generation
	}
	return g
}

// ReplicationSnapshotPrefix starts the short name of the snapshots that
// replication takes (docs/replication.md): internal, never CSI snapshots.
const ReplicationSnapshotPrefix = "zn-"

const (
	RolePrimary = "primary"
	// RoleDeleted marks a tombstone: a volume the CO deleted while it still
	// had snapshots. It is invisible as a volume and destroyed with its last
	// snapshot. See docs/volumes.md.
	RoleDeleted = "deleted"
	// RoleReplica marks a copy received from another node's primary:
	// read-only, never staged, promoted by migration or failover.
	RoleReplica = "replica"
	// RoleSetAside marks a stale primary that came back after a failover:
	// renamed to <id>-aside-<nanos>, never mounted, kept for an operator.
	RoleSetAside = "set-aside"
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

// datasetFor returns the dataset of volume id under root.
func datasetFor(root, id string) string { return root + "/" + id }

// AsideName is the name a copy set aside at t gets: <dataset>-aside-<nanos>.
// Not a volume ID, so nothing lists it as a volume or a replica.
func AsideName(dataset string, t time.Time) string {
	return fmt.Sprintf("%s-aside-%d", dataset, t.UnixNano())
}

// shortName returns the part of a ZFS name after its last '/' or '@'.
func shortName(name string) string {
	if i := strings.LastIndexAny(name, "/@"); i >= 0 {
		return name[i+1:]
	}
	return name
}
