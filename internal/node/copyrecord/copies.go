package copyrecord

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/volumelog"
)

// Store is what reading and removing a node's replicas needs of ZFS (a
// part of zfs.Interface).
type Store interface {
	zfs.PropertyReader
	zfs.SnapshotLister
	Holds(ctx context.Context, fs string) (map[string][]string, error)
	Release(ctx context.Context, snapshot, tag string) error
	SetProperties(ctx context.Context, name string, props map[string]string) error
	DestroySnapshot(ctx context.Context, snapshot string) error
	DestroyRecursive(ctx context.Context, fs string) error
	AbortReceive(ctx context.Context, target string) error
	Rename(ctx context.Context, from, to string) error
}

// Replicas reads and removes the replicas under one node's root: the
// inventory the node reports to the controller, replica deletion, and
// the tombstones a deleted replica becomes when it keeps CSI snapshots.
// It takes no locks: a caller that changes a copy holds the copy's lock
// (package copylock), as every change of a copy on a node does.
type Replicas struct {
	store Store
	root  string
}

// NewReplicas returns the replicas of the node whose volumes live under
// root.
func NewReplicas(store Store, root string) *Replicas {
	return &Replicas{store: store, root: root}
}

// Replica is a copy this node holds of another node's volume.
type Replica struct {
	VolumeID string
	Name     string
	// LastSnapshot is the newest snapshot received; LastSnapshotTime is
	// when the source took it: the replica is current as of then.
	LastSnapshot     string
	LastSnapshotTime time.Time
	// Resumable: an interrupted receive waits to be resumed.
	Resumable bool
	// DemotedAt: when this replica was demoted from primary after a move;
	// zero when it was not. Such a copy is surplus once the volume's
	// other replicas are as fresh (a Surplus removal).
	DemotedAt time.Time
}

// holdingProps are the properties the inventory reads of each copy.
var holdingProps = []string{PropVolumeID, PropRole, PropName, PropDemotedAt, "receive_resume_token"}

// Holdings lists, in one listing of this node's root (it costs seconds
// at a thousand datasets), the replicas under it and the stale primaries
// set aside there (docs/migration.md: kept for an operator, never
// mounted).
func (r *Replicas) Holdings(ctx context.Context) (replicas []Replica, setAside []string, err error) {
	children, err := r.store.ChildProperties(ctx, r.root, holdingProps...)
	if err != nil {
		return nil, nil, err
	}
	for _, ch := range children {
		switch role := ch.Props[PropRole]; {
		case role == contract.RoleSetAside:
			setAside = append(setAside, ch.Name)
		case r.IsReplica(ch):
			rep, err := r.replica(ctx, ch)
			if err != nil {
				return nil, nil, err
			}
			replicas = append(replicas, rep)
		}
	}
	return replicas, setAside, nil
}

// ReplicaOf reads this node's replica of volumeID as Holdings reports it,
// or false when the node holds none (a replacement labelled but not yet
// renamed into place is none yet).
func (r *Replicas) ReplicaOf(ctx context.Context, volumeID string) (Replica, bool, error) {
	fs, props, ok, err := r.readReplica(ctx, volumeID)
	if !ok || err != nil {
		return Replica{}, false, err
	}
	rep, err := r.replica(ctx, zfs.Child{Name: fs, Props: props})
	return rep, err == nil, err
}

// readReplica reads the inventory's properties of volumeID's replica:
// ok is false when the node holds none.
func (r *Replicas) readReplica(ctx context.Context, volumeID string) (fs string, props map[string]string, ok bool, err error) {
	if !contract.IsVolumeID(volumeID) {
		return "", nil, false, nil // names no volume, so no replica of one
	}
	fs = r.root + "/" + volumeID
	props, err = r.store.Properties(ctx, fs, holdingProps...)
	if errors.Is(err, zfs.ErrNotFound) {
		return "", nil, false, nil
	}
	if err != nil {
		return "", nil, false, err
	}
	return fs, props, r.IsReplica(zfs.Child{Name: fs, Props: props}), nil
}

// IsReplica tells whether a child of the root, read with at least its
// volume ID and role, is a replica. A replacement labelled but not yet
// renamed into place is not the replica yet.
func (r *Replicas) IsReplica(ch zfs.Child) bool {
	return ch.Props[PropRole] == contract.RoleReplica && ch.Name == r.root+"/"+ch.Props[PropVolumeID]
}

// replica reads what Holdings reports of one replica: its newest
// snapshot.
func (r *Replicas) replica(ctx context.Context, ch zfs.Child) (Replica, error) {
	rep := Replica{VolumeID: ch.Props[PropVolumeID], Name: ch.Props[PropName], Resumable: ch.Props["receive_resume_token"] != "-",
		DemotedAt: DemotedAt(ch.Props[PropDemotedAt])}
	volumelog.Learn(rep.VolumeID, rep.Name)
	snaps, err := r.store.Snapshots(ctx, ch.Name)
	if err != nil {
		return Replica{}, err
	}
	if len(snaps) > 0 {
		last := snaps[len(snaps)-1]
		rep.LastSnapshot, rep.LastSnapshotTime = ShortSnapshotName(last.Name), time.Unix(last.Created, 0)
	}
	return rep, nil
}

// ShortSnapshotName is the part of a snapshot's full name after the "@".
func ShortSnapshotName(full string) string {
	_, snap, _ := strings.Cut(full, "@")
	return snap
}

// IsLiveCSISnapshot reports whether s is a CSI snapshot not deleted: its
// short name is a snapshot ID and it is not waiting for a deferred
// destroy (docs/replication.md, "CSI snapshots").
func IsLiveCSISnapshot(s zfs.Snap) bool {
	return !s.Deferred && contract.IsSnapshotID(ShortSnapshotName(s.Name))
}
