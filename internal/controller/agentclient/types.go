package agentclient

import (
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// NodeInfo is what an agent says about its node (GetNode).
type NodeInfo struct {
	NodeID   string
	Topology map[string]string
	// Capacity: zero when asked without it (GetNodeOptions).
	AvailableBytes uint64
	MaxQuotaBytes  uint64
	Volumes        int64
	MaxVolumes     int64
	// UnhealthyReason is empty when the node is healthy.
	UnhealthyReason string
	Version         string
	// VolumesVersion changes whenever the node's primaries change, when
	// it deletes a replica and when its process restarts; empty from a
	// node that keeps none.
	VolumesVersion string
	// KnownNodes is how many nodes the node's lease counts, itself
	// included (0: it keeps no lease). Majorities are taken over the
	// largest count any node reports (cluster.Majority).
	KnownNodes int
	// RetiredNodes names the node the operator retired on this node since
	// it started, if any (zfs-controller retire-node).
	RetiredNodes []string
	// Witnesses is the node's witness set (node_id@host:port each;
	// empty: every node counts), cluster.Witnesses.
	Witnesses []string
	// OpenZFS is the release of the node's kernel module; LeaseHeld
	// whether it holds its lease (always, keeping none);
	// CertificateNotAfter when its agent certificate expires (zero: no
	// TLS). Empty or zero from a node of an older build.
	OpenZFS             string
	LeaseHeld           bool
	CertificateNotAfter time.Time
	// AwaitedPromotions are the node's stages waiting for their copy's
	// promotion by a move granted ahead of its end.
	AwaitedPromotions []AwaitedPromotion
}

// AwaitedPromotion is a stage waiting, for Waiting so far, until the
// node's copy of a volume is a primary newer than AfterGeneration.
type AwaitedPromotion struct {
	VolumeID        string
	AfterGeneration uint64
	Waiting         time.Duration
}

// GetNodeOptions shape a GetNode call.
type GetNodeOptions struct {
	// WithoutCapacity skips counting the node's volumes and free space.
	WithoutCapacity bool
	// WithoutHealth skips capacity and the node's health read as well
	// (NodeInfo.UnhealthyReason stays empty, whatever the pool's state):
	// for questions that place nothing, such as which stages wait.
	WithoutHealth bool
	// WaitForReady waits for the connection to come up (within the
	// context's deadline) instead of failing at once while it is down.
	WaitForReady bool
}

// Volume is a volume's primary copy as its node reports it.
type Volume struct {
	VolumeID      string
	Name          string
	CapacityBytes uint64
	UsedBytes     uint64
	Parameters    map[string]string
	// Source is "snapshot:<id>" or "volume:<id>" for a volume created
	// from a content source, else empty.
	Source               string
	NodeID               string
	CreatedUnix          int64
	Generation           uint64
	MovingTo             string
	FailoverFromSnapshot string
}

// NewVolume asks a node to create a volume (CreateVolume).
type NewVolume = contract.VolumeRequest

// Page selects part of a node's volume list: the volumes from From on,
// at most MaxEntries (zero: all).
type Page struct {
	From       string
	MaxEntries uint32
}

// Snapshot is a volume snapshot on a node.
type Snapshot struct {
	SnapshotID     string
	Name           string
	SourceVolumeID string
	SizeBytes      uint64
	CreatedUnix    int64
	NodeID         string
	// Deleted marks a record, not a copy: every copy of SnapshotID
	// created at or before CreatedUnix is deleted (docs/replication.md,
	// "Deleted snapshots"). Only a query WithDeleted or DeletedOnly
	// answers records.
	Deleted bool
	// OwnerDigest is the owner secret's digest of the volume the copy is
	// of, answered to a query by SnapshotID (contract.ParamOwnerDigest).
	OwnerDigest string
}

// SnapshotQuery selects a node's snapshots: by ID, by source volume, and
// a page of the list (from From on, at most MaxEntries; zero: all).
// WithDeleted adds the node's records of deleted snapshots of that ID or
// volume, all of them whatever the page; DeletedOnly answers only those.
type SnapshotQuery struct {
	SnapshotID     string
	SourceVolumeID string
	From           string
	MaxEntries     uint32
	WithDeleted    bool
	DeletedOnly    bool
}

// SnapshotDeletion asks a node to delete its copy of a snapshot: only a
// copy created at or before CreatedUpToUnix when that is set (a record
// never deletes a snapshot taken again under the same name). Remember
// first records on the node that the snapshot is deleted; Forget removes
// that record once no copy is left anywhere.
type SnapshotDeletion struct {
	SnapshotID      string
	CreatedUpToUnix int64
	Remember        bool
	SourceVolumeID  string // of the record Remember writes
	Forget          bool
}

// Progress is one report of a push (Replicate).
type Progress struct {
	Kind       string
	Snapshot   string
	Base       string
	Bytes      int64
	TotalBytes int64 // the estimate; zero when unknown
	Done       bool  // the push completed
	FencedAt   int64 // a MoveFinal's fence time (unix nanos)
}

// NodeStatus is what a node holds besides its primaries: its replicas,
// the transfers it runs and the stale primaries set aside.
type NodeStatus struct {
	Replicas  []Replica
	Transfers []Transfer
	SetAside  []string
	// BackupFailures are the last failed backup of each volume to each
	// target, until a backup there succeeds.
	BackupFailures []BackupFailure
}

// BackupFailure is the last failed backup of a volume to a target.
type BackupFailure struct {
	VolumeID, Target, Error string
	AtUnix                  int64
}

// Changes is what a node tells of the volumes whose copy there changed
// since it reported a volumes version. Known is false when it cannot tell
// (nor can a node too old to know the call): ask it for everything.
type Changes struct {
	Known     bool
	VolumeIDs []string  // every volume whose copy changed
	Volumes   []Volume  // those that are primaries there now
	Replicas  []Replica // those that are replicas there now
}

// Replica is a replica held on a node.
type Replica struct {
	VolumeID         string
	Name             string
	LastSnapshot     string
	LastSnapshotUnix int64
	Resumable        bool
	// DemotedAtUnix: when the replica was demoted from primary after a
	// move; 0 when it was not.
	DemotedAtUnix int64
}

// Transfer is a push running on its source node.
type Transfer struct {
	VolumeID    string
	Peer        string
	Kind        string
	Bytes       int64
	TotalBytes  int64
	StartedUnix int64
	Purpose     string // why it runs, as its requester said
}

// Copy is everything a node knows of its copy of a volume (GetCopy), and
// the generation it promised for the volume.
type Copy struct {
	VolumeID string
	NodeID   string
	Exists   bool
	Role     string // contract.RolePrimary or contract.RoleReplica
	// Generation of the copy, and on a fenced primary the node it is
	// moving to and when it was fenced.
	Generation     uint64
	MovingTo       string
	FencedUnixNano int64
	Mounted        bool // staged or published on its node
	// The newest replication snapshot and when it was taken (unix nanos,
	// from its name).
	LastSnapshot         string
	LastSnapshotUnixNano int64
	Parameters           map[string]string
	CapacityBytes        uint64
	Resumable            bool // an interrupted receive waits to be resumed
	Name                 string
	FailoverFromSnapshot string
	// The highest generation of the volume the node promised, and to
	// which node: set whether or not the node holds a copy.
	PromisedGeneration uint64
	PromisedHolder     string
	// On a replica: its snapshots' GUIDs, oldest first.
	SnapshotGUIDs []uint64
	// On a primary promoted without a majority: the generation it was
	// forced at.
	ForcedGeneration uint64
	// A primary read-only since its node lost its lease.
	LeaseFenced bool
	// On a primary: the bytes written since each of its replication
	// snapshots, by short name; empty from an older node.
	WrittenSince map[string]uint64
	// The oldest generation this copy's history holds whole (a planned
	// move keeps its source's, a failover starts at its own); 0 from an
	// older node.
	HistoryFrom uint64
}

// Reservation asks a node to promise a generation of a volume to a
// holder's copy (Reserve).
type Reservation struct {
	VolumeID     string
	Generation   uint64
	HolderNodeID string
	// FailoverFrom names the agents that did not answer: the node grants
	// only once its lease says they have been silent long enough.
	FailoverFrom []string
	// Failover marks a failover's reservation; Answering names the nodes
	// that answered the controller. The node attests the silence of
	// FailoverFrom and of every peer its lease knows that is not among
	// Answering: a peer the controller's list lost is still asked after.
	Failover  bool
	Answering []string
	// Operator: the operator's promotion (zfs-controller promote). A node
	// without peers grants its failover on the operator's word; nodes
	// that keep leases still wait for the silence.
	Operator bool
	// WitnessDigest is the digest of the witness set the majority is
	// counted over ("" for none); a node with another set refuses.
	WitnessDigest string
}

// Promise is a node's answer to a Reservation: granted, or the promise
// it holds instead.
type Promise struct {
	Granted            bool
	PromisedGeneration uint64
	PromisedHolder     string
}

// Promotion makes a node's copy the primary of a generation (Promote).
type Promotion struct {
	VolumeID          string
	Generation        uint64
	NotBeforeUnixNano int64
	Failover          bool
	Forced            bool
	// SourceNodeID is a planned move's source (PromoteRequest).
	SourceNodeID string
}

// Demotion retires a node's older primary (Demote): to a replica, or set
// aside when Aside.
type Demotion struct {
	VolumeID   string
	Generation uint64
	Aside      bool
}
