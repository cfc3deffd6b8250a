package replication

import (
	"context"
	"errors"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfscmd"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

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
	// other replicas are as fresh (DeleteSurplus).
	DemotedAt time.Time
}

// Holdings lists, in one listing of this node's root (it costs seconds
// at a thousand datasets), the replicas under it and the stale primaries
// set aside there (docs/migration.md: kept for an operator, never
// mounted).
func (r *Receiver) Holdings(ctx context.Context) (replicas []Replica, setAside []string, err error) {
	children, err := r.z.Children(ctx, r.root, holdingProps...)
	if err != nil {
		return nil, nil, err
	}
	for _, ch := range children {
		switch role := ch.Props[copyrecord.PropRole]; {
		case role == contract.RoleSetAside:
			setAside = append(setAside, ch.Name)
		case r.isReplica(ch):
			rep, err := r.replica(ctx, ch)
			if err != nil {
				return nil, nil, err
			}
			replicas = append(replicas, rep)
		}
	}
	return replicas, setAside, nil
}

// holdingProps are the properties Holdings and ReplicaOf read.
var holdingProps = []string{copyrecord.PropVolumeID, copyrecord.PropRole, copyrecord.PropName, copyrecord.PropDemotedAt, "receive_resume_token"}

// ReplicaOf reads this node's replica of volumeID as Holdings reports it,
// or false when the node holds none (a replacement labelled but not yet
// renamed into place is none yet).
func (r *Receiver) ReplicaOf(ctx context.Context, volumeID string) (Replica, bool, error) {
	fs, err := dataset(r.root, volumeID)
	if err != nil {
		return Replica{}, false, nil // names no volume, so no replica of one
	}
	props, err := r.z.GetAll(ctx, fs, holdingProps...)
	if errors.Is(err, zfs.ErrNotFound) {
		return Replica{}, false, nil
	}
	if err != nil {
		return Replica{}, false, err
	}
	ch := zfscmd.Child{Name: fs, Props: props}
	if !r.isReplica(ch) {
		return Replica{}, false, nil
	}
	rep, err := r.replica(ctx, ch)
	return rep, err == nil, err
}

// isReplica tells whether a child of the root, read with holdingProps, is
// a replica. A replacement labelled but not yet renamed into place is not
// the replica yet.
func (r *Receiver) isReplica(ch zfscmd.Child) bool {
	return ch.Props[copyrecord.PropRole] == RoleReplica && ch.Name == r.root+"/"+ch.Props[copyrecord.PropVolumeID]
}

// replica reads what Holdings reports of one replica: its newest
// snapshot.
func (r *Receiver) replica(ctx context.Context, ch zfscmd.Child) (Replica, error) {
	rep := Replica{VolumeID: ch.Props[copyrecord.PropVolumeID], Name: ch.Props[copyrecord.PropName], Resumable: ch.Props["receive_resume_token"] != "-",
		DemotedAt: copyrecord.DemotedAt(ch.Props[copyrecord.PropDemotedAt])}
	snaps, err := r.z.Snapshots(ctx, ch.Name)
	if err != nil {
		return Replica{}, err
	}
	if len(snaps) > 0 {
		last := snaps[len(snaps)-1]
		rep.LastSnapshot, rep.LastSnapshotTime = shortSnapshotName(last.Name), time.Unix(last.Created, 0)
	}
	return rep, nil
}
