// Package copyrecord is the on-disk record of a volume's copies: the ZFS
// user properties the driver writes on a node's datasets and snapshots,
// what each one means, how their values are written and read, and the
// names a copy takes when it is set aside or becomes a tombstone. The
// properties are the truth about every volume (the controller keeps no
// state and rebuilds its view from them), so every package that reads or
// writes them (the volumes, replication, the tests that look at a pool)
// takes their names and formats from here. Replicas reads the node's
// replicas from that record and removes them: the inventory the node
// reports, replica deletion and its tombstones.
//
// The driver's words (generation, promise, fence, lease, set aside,
// tombstone, ...) are defined in docs/glossary.md.
package copyrecord

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// The user properties the driver owns in ZFS (the package comment says
// why they are the truth).
const (
	propPrefix = "zfs-nomad:"
	// On volume filesystems.
	PropVolumeID   = propPrefix + "volume_id"  // the CSI volume ID; equals the dataset's last component
	PropName       = propPrefix + "name"       // the CSI name it was created with
	PropRole       = propPrefix + "role"       // contract.RolePrimary, RoleReplica, RoleDeleted or RoleSetAside
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
	PropDemotedAt   = propPrefix + "demoted_at"    // on a replica that was the primary before a move: unix seconds then; "-" or unset otherwise
	// On a primary made read-only when its node lost its lease: unix
	// nanos then; "-" when lifted.
	PropLeaseFenced = propPrefix + "lease_fenced"
	// On a primary this node learned a newer generation of was promised
	// elsewhere (FenceSuperseded): that generation; "-" when lifted. It
	// comes with PropLeaseFenced and readonly=on.
	PropSuperseded = propPrefix + "superseded"
	// On primaries and replicas: the oldest generation whose every state
	// is in this copy's history (see HistoryFrom).
	PropHistoryFrom = propPrefix + "history_from"
	// On a new volume whose root directory's owner and mode are still to
	// be set (parameters uid, gid, mode): a create that stopped half-way
	// is finished by its retry.
	PropRootPending = propPrefix + "root_pending"
	// On replicas: the node whose full stream created the replica (its
	// certificate's name), which the bound on replicas per peer counts.
	PropReceivedFrom = propPrefix + "received_from"
	// On snapshots.
	PropSnapshotName = propPrefix + "snapshot_name" // the CSI name of a CSI snapshot
	PropSourceVolume = propPrefix + "source_volume" // the CSI volume ID it was taken of

	// On a backup target (docs/backups.md): the grid a volume's backups
	// are pruned by, on its chain; when a backup arrived (unix seconds,
	// the target's clock), on its snapshot.
	PropRetention  = propPrefix + "retention"
	PropReceivedAt = propPrefix + "received_at"
)

// UserProperties are the properties the node's Get and List read with
// every dataset (libzfs.New). The others (demoted_at, set_aside_at,
// received_from, the promise and deleted-snapshot records) are read by
// name where they are needed.
var UserProperties = []string{
	PropVolumeID, PropName, PropRole, PropGeneration, PropParameters, PropSource,
	PropDeletedAt, PropSnapshotName, PropSourceVolume,
	PropMovingTo, PropFencedAt, PropCapacity, PropFailoverLag, PropForced,
	PropHistoryFrom, PropLeaseFenced, PropSuperseded, PropRootPending,
	PropRetention, PropReceivedAt,
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

// PropPromisePrefix + volume ID, on the volume's promise shard:
// "GENERATION HOLDER".
const PropPromisePrefix = propPrefix + "promise:"

// PropDeletedSnapshotPrefix + snapshot ID, on the node's promises dataset:
// "CREATED_UNIX SOURCE_VOLUME_ID" (DeletedSnapshot).
const PropDeletedSnapshotPrefix = propPrefix + "deleted-snapshot:"

// AsideName is the name a copy set aside at t gets: <dataset>-aside-<nanos>.
// Not a volume ID, so nothing lists it as a volume or a replica.
func AsideName(dataset string, t time.Time) string {
	return fmt.Sprintf("%s-aside-%d", dataset, t.UnixNano())
}

// SetAsideLabels are the properties that mark a copy set aside at t, set
// before it is renamed AsideName: read-only, never mounted, kept for an
// operator.
func SetAsideLabels(t time.Time) map[string]string {
	return map[string]string{"readonly": "on", PropRole: contract.RoleSetAside, PropSetAsideAt: t.UTC().Format("2006-01-02T15:04:05Z")}
}

// TombstoneLabels are the properties that mark a copy deleted at now,
// set before it is renamed TombstoneName: a tombstone, primary or
// replica before, is found by its role wherever a crash left it.
func TombstoneLabels(now time.Time) map[string]string {
	return map[string]string{PropRole: contract.RoleDeleted, PropDeletedAt: now.UTC().Format(time.RFC3339)}
}

// TombstoneName is the name a copy at dataset takes when it becomes a
// tombstone at now: the volume's name is free again at once.
func TombstoneName(dataset string, now time.Time) string {
	return fmt.Sprintf("%s-deleted-%d", dataset, now.UnixNano())
}

// NotMoving is PropMovingTo on a primary that is not fenced for a move.
const NotMoving = "-"

// MovingTo reads PropMovingTo: the node a primary fenced for a move moves
// to; "" when it is not fenced (NotMoving, or never labelled).
func MovingTo(value string) string {
	if value == NotMoving {
		return ""
	}
	return value
}

// FencedAt reads PropFencedAt: the fence's time (unix nanos), and whether
// the value is one.
func FencedAt(value string) (int64, bool) {
	at, err := strconv.ParseInt(value, 10, 64)
	return at, err == nil && at > 0
}

// DemotedAt reads PropDemotedAt: when a replica was demoted from primary
// after a move; zero when it was not (or was promoted since).
func DemotedAt(value string) time.Time {
	secs, err := strconv.ParseInt(value, 10, 64)
	if err != nil || secs <= 0 {
		return time.Time{}
	}
	return time.Unix(secs, 0)
}

// EncodeParameters gives the canonical form stored in PropParameters
// (encoding/json sorts map keys).
func EncodeParameters(params map[string]string) string {
	if len(params) == 0 {
		return "{}"
	}
	b, _ := json.Marshal(params) // a map of strings always encodes
	return string(b)
}

// DecodeParameters reads PropParameters; a damaged value reads as no
// parameters.
func DecodeParameters(s string) map[string]string {
	out := map[string]string{}
	if err := json.Unmarshal([]byte(s), &out); err != nil {
		// Unmarshal keeps what it decoded before the damage ({"a":1}
		// leaves a=""): none of it is a parameter the volume was given.
		return map[string]string{}
	}
	return out
}
