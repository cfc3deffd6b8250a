package agent

import (
	"context"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
)

// Node is the node's parts the agent serves, each as the agent uses it:
// in zfs-node, the volume package's Manager (Volumes and Copies), Index,
// Records and Fences (Forcing), and the replication's parts.
type Node struct {
	Volumes Volumes
	Copies  Copies
	Index   Index
	Records Records
	Forcing Forcing
	// Replicas is the inventory of the node's replicas; nil, as Pusher
	// and Receiver are, on a node without replication.
	Replicas *copyrecord.Replicas
	Pusher   *replication.Pusher
	Receiver *replication.Receiver
}

// Volumes are the node's volumes and CSI snapshots.
type Volumes interface {
	Health(ctx context.Context) error
	Capacity(ctx context.Context) (volume.Capacity, error)
	Create(ctx context.Context, req volume.CreateRequest) (volume.Volume, error)
	Get(ctx context.Context, id string) (volume.Volume, error)
	List(ctx context.Context) ([]volume.Volume, error)
	Expand(ctx context.Context, id string, required, limit uint64) (uint64, error)
	Delete(ctx context.Context, id string) error
	CreateSnapshotAfter(ctx context.Context, volumeID, name string, createdAfterUnix int64) (volume.Snapshot, error)
	GetSnapshot(ctx context.Context, id string) (volume.Snapshot, error)
	DeleteSnapshotUpTo(ctx context.Context, id string, createdUpToUnix int64) error
	// ForgetDeleted removes the record of a deleted snapshot once no copy
	// it covers is on the node.
	ForgetDeleted(ctx context.Context, id string) error
}

// Copies are the node's copies of volumes as a move, a failover and a
// delete hand them over.
type Copies interface {
	Copy(ctx context.Context, id string) (volume.Copy, error)
	Fence(ctx context.Context, id, target string) (int64, error)
	FenceHeld(ctx context.Context, id, target string, at int64) (int64, error)
	Unfence(ctx context.Context, id string, generation uint64) error
	Promote(ctx context.Context, id string, generation uint64, notBefore int64, source string, failover bool) (volume.Copy, error)
	Demote(ctx context.Context, id string, generation uint64, aside bool) error
	DeleteReplica(ctx context.Context, id string) (bool, error)
	DeleteSurplus(ctx context.Context, id, newest string, elsewhere []string) (bool, error)
	// Forget drops the promise of a volume being deleted.
	Forget(ctx context.Context, id string) error
	AwaitedPromotions() []volume.AwaitedPromotion
}

// Index is the node's index of its primaries and CSI snapshots.
type Index interface {
	VolumesVersion() string
	ChangedSince(version string, limit int) ([]string, bool)
	ListPage(ctx context.Context, from string, limit int) ([]volume.Volume, error)
	SnapshotPage(ctx context.Context, from string, limit int, source string) ([]volume.Snapshot, error)
}

// Records are the node's promise and deleted-snapshot records.
type Records interface {
	Promised(ctx context.Context, id string) (copyrecord.Promise, error)
	Reserve(ctx context.Context, id string, generation uint64, holder string) (copyrecord.Promise, bool, error)
	ReserveForFailover(ctx context.Context, id string, generation uint64, holder string) (copyrecord.Promise, bool, error)
	DeletedSnapshots(ctx context.Context) ([]copyrecord.DeletedSnapshot, error)
	RememberDeleted(ctx context.Context, d copyrecord.DeletedSnapshot) error
}

// Forcing marks a primary the operator promoted without a majority.
type Forcing interface {
	MarkForced(ctx context.Context, id string, generation uint64) error
}
