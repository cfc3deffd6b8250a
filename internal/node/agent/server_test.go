package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

const root = "tank/nomad"

func newServer(t *testing.T) (*Server, *volume.Manager, *zfsfake.Fake) {
	t.Helper()
	fake := zfsfake.New(10<<30, "tank")
	s, volumes := newServerOver(t, fake)
	return s, volumes, fake
}

// newServerOver is newServer over z, a fake or a wrapper of one.
func newServerOver(t *testing.T, fake zfs.Interface) (*Server, *volume.Manager) {
	t.Helper()
	if err := fake.CreateFilesystem(context.Background(), root, nil); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultNode()
	cfg.NodeID, cfg.RootDataset = "n1", root
	cfg.MaxQuota, cfg.DefaultQuota = 4<<30, 1<<30
	log := hclog.NewNullLogger()
	replicas := copyrecord.NewReplicas(fake, root)
	volumes := volume.NewManager(volume.Deps{ZFS: fake, Config: cfg, Log: log, Replicas: replicas})
	receiver := replication.NewReceiver(fake, volumes.Locks(), volumes.Index(), root, cfg.NodeID, cfg.ReplicationSnapshots, log)
	return NewServer(nodeOf(volumes, replicas, nil, receiver), cfg, log), volumes
}

// TestGetCopyListsAReplicasSnapshotsOnce: every decision asks every node
// for its copy, so what GetCopy reads is paid on each node at every
// look: a replica's snapshots are listed once, with the GUIDs a push
// plans from, not once by name and again with their GUIDs.
func TestGetCopyListsAReplicasSnapshotsOnce(t *testing.T) {
	ctx := context.Background()
	counting := &zfsfake.Counting{Interface: zfsfake.New(10<<30, "tank")}
	s, _ := newServerOver(t, counting)
	id := "vol-00000000000000000001"
	fs := root + "/" + id
	if err := counting.CreateFilesystem(ctx, fs, map[string]string{
		copyrecord.PropVolumeID: id, copyrecord.PropRole: contract.RoleReplica, copyrecord.PropName: "theirs", copyrecord.PropGeneration: "2"}); err != nil {
		t.Fatal(err)
	}
	const snapshots = 20
	for i := range snapshots {
		if err := counting.Snapshot(ctx, fs+"@"+contract.ReplicationSnapshotName(int64(i+1)*1e9), nil); err != nil {
			t.Fatal(err)
		}
	}
	before := counting.Work()
	c, err := s.GetCopy(ctx, &pb.GetCopyRequest{VolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.GetSnapshotGuids()) != snapshots || c.GetRole() != contract.RoleReplica || c.GetLastSnapshot() != contract.ReplicationSnapshotName(snapshots*1e9) {
		t.Fatalf("GetCopy answered %d GUIDs, role %q, newest %q: want %d, a replica, the newest snapshot",
			len(c.GetSnapshotGuids()), c.GetRole(), c.GetLastSnapshot(), snapshots)
	}
	// One listing (1 + a dataset each), and a handful of reads of the
	// copy itself (the dataset, the promise, the resume token).
	if work, most := counting.Work()-before, int64(snapshots+6); work > most {
		t.Fatalf("GetCopy of a replica with %d snapshots did %d units of ZFS work, want at most %d: its snapshots listed more than once?", snapshots, work, most)
	}
}

// TestChangesTellsWhatBecameOfEachChangedVolume: the schedule's round
// after a change asks the node what changed since the version it saw; the
// node answers, for each volume changed since, its primary or its replica
// here now, or neither; and cannot tell for another process's version.
func TestChangesTellsWhatBecameOfEachChangedVolume(t *testing.T) {
	ctx := context.Background()
	s, volumes, fake := newServer(t)
	kept, err := volumes.Create(ctx, volume.CreateRequest{Name: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	since := volumes.Index().VolumesVersion()
	made, err := volumes.Create(ctx, volume.CreateRequest{Name: "made"})
	if err != nil {
		t.Fatal(err)
	}
	gone, err := volumes.Create(ctx, volume.CreateRequest{Name: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if err := volumes.Delete(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	// A replica here of another node's volume, whose change is noted (as
	// DeleteReplica notes one).
	replicaID := "vol-00000000000000000001"
	if err := fake.CreateFilesystem(ctx, root+"/"+replicaID, map[string]string{
		copyrecord.PropVolumeID: replicaID, copyrecord.PropRole: replication.RoleReplica, copyrecord.PropName: "theirs"}); err != nil {
		t.Fatal(err)
	}
	volumes.Index().NoteChanged(replicaID)

	resp, err := s.Changes(ctx, &pb.ChangesRequest{Since: since})
	if err != nil {
		t.Fatal(err)
	}
	wantIDs := []string{gone.ID, made.ID, replicaID}
	slices.Sort(wantIDs)
	if !resp.GetKnown() || !slices.Equal(resp.GetVolumeIds(), wantIDs) {
		t.Fatalf("Changes = known %v, %v; want known, %v (not %s, unchanged)", resp.GetKnown(), resp.GetVolumeIds(), wantIDs, kept.ID)
	}
	if len(resp.GetVolumes()) != 1 || resp.GetVolumes()[0].GetVolumeId() != made.ID {
		t.Errorf("primaries told: %v; want %s alone", resp.GetVolumes(), made.ID)
	}
	if len(resp.GetReplicas()) != 1 || resp.GetReplicas()[0].GetVolumeId() != replicaID || resp.GetReplicas()[0].GetName() != "theirs" {
		t.Errorf("replicas told: %v; want %s", resp.GetReplicas(), replicaID)
	}

	resp, err = s.Changes(ctx, &pb.ChangesRequest{Since: "1-0"})
	if err != nil || resp.GetKnown() {
		t.Errorf("Changes since another process's version = known %v, %v; want not known", resp.GetKnown(), err)
	}
}

// TestDeleteSurplus: the node removes a replica as a surplus copy only
// when that loses nothing the caller did not judge: a copy demoted after
// a move, whose newest snapshot is the one the schedule saw, with no
// snapshot but replication snapshots. Anything else is refused with
// FailedPrecondition and left as it was; a primary, or no copy, is not a
// replica to delete.
func TestDeleteSurplus(t *testing.T) {
	ctx := context.Background()
	demoted := map[string]string{copyrecord.PropRole: replication.RoleReplica, copyrecord.PropDemotedAt: "1800000000"}
	csi := contract.SnapshotIDForName("before-upgrade")
	tests := []struct {
		name      string
		props     map[string]string // nil: no copy
		snapshots []string
		newest    string
		elsewhere []string // CSI snapshots the caller found on the other copies
		deleted   bool
		refused   bool
	}{
		{"demoted, as fresh as judged", demoted, []string{"zn-1", "zn-2"}, "zn-2", nil, true, false},
		{"not demoted: the schedule's own replica", map[string]string{copyrecord.PropRole: replication.RoleReplica}, []string{"zn-2"}, "zn-2", nil, false, true},
		{"promoted since", map[string]string{copyrecord.PropRole: replication.RoleReplica, copyrecord.PropDemotedAt: "-"}, []string{"zn-2"}, "zn-2", nil, false, true},
		{"received since it was judged", demoted, []string{"zn-2", "zn-3"}, "zn-2", nil, false, true},
		{"holds a snapshot made by hand", demoted, []string{"before-upgrade", "zn-2"}, "zn-2", []string{"before-upgrade"}, false, true},
		{"holds a CSI snapshot the other copies lack", demoted, []string{csi, "zn-2"}, "zn-2", []string{contract.SnapshotIDForName("other")}, false, true},
		{"holds a CSI snapshot the other copies hold", demoted, []string{csi, "zn-2"}, "zn-2", []string{csi}, true, false},
		{"a primary", map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropDemotedAt: "1800000000"}, []string{"zn-2"}, "zn-2", nil, false, false},
		{"no copy", nil, nil, "zn-2", nil, false, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, fake := newServer(t)
			id := fmt.Sprintf("vol-%020d", i+1)
			fs := root + "/" + id
			if tt.props != nil {
				props := maps.Clone(tt.props)
				props[copyrecord.PropVolumeID] = id
				if err := fake.CreateFilesystem(ctx, fs, props); err != nil {
					t.Fatal(err)
				}
				for _, snap := range tt.snapshots {
					if err := fake.Snapshot(ctx, fs+"@"+snap, nil); err != nil {
						t.Fatal(err)
					}
				}
			}
			resp, err := s.DeleteReplica(ctx, &pb.DeleteReplicaRequest{VolumeId: id, SurplusNewest: tt.newest, SnapshotsElsewhere: tt.elsewhere})
			if tt.refused {
				if !errors.Is(err, errdefs.ErrFailedPrecondition) {
					t.Fatalf("DeleteReplica as surplus: %v, want FailedPrecondition", err)
				}
			} else if err != nil || resp.GetDeleted() != tt.deleted {
				t.Fatalf("DeleteReplica as surplus: deleted %v, %v; want %v", resp.GetDeleted(), err, tt.deleted)
			}
			_, err = fake.Get(ctx, fs)
			if exists := err == nil; exists != (tt.props != nil && !tt.deleted) {
				t.Errorf("after it the copy exists: %v (%v)", exists, err)
			}
		})
	}
}

// TestDeleteSnapshotRemembersAndForgets: the agent records a deletion
// before it deletes the copy, answers the record with the snapshots when
// asked (and only then), and forgets it on request.
func TestDeleteSnapshotRemembersAndForgets(t *testing.T) {
	ctx := context.Background()
	s, volumes, _ := newServer(t)
	v, err := volumes.Create(ctx, volume.CreateRequest{Name: "v"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := volumes.CreateSnapshot(ctx, v.ID, "s")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := volumes.CreateSnapshot(ctx, v.ID, "kept")
	if err != nil {
		t.Fatal(err)
	}
	del := &pb.DeleteSnapshotRequest{SnapshotId: snap.ID, CreatedUpToUnix: snap.Created.Unix(), Remember: true, SourceVolumeId: v.ID}
	if _, err := s.DeleteSnapshot(ctx, del); err != nil {
		t.Fatal(err)
	}
	list := func(req *pb.ListSnapshotsRequest) (copies, records []string) {
		t.Helper()
		resp, err := s.ListSnapshots(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, sn := range resp.GetSnapshots() {
			if sn.GetDeleted() {
				records = append(records, sn.GetSnapshotId())
			} else {
				copies = append(copies, sn.GetSnapshotId())
			}
		}
		return copies, records
	}
	for _, c := range []struct {
		req                   *pb.ListSnapshotsRequest
		wantCopies, wantRecds []string
	}{
		{&pb.ListSnapshotsRequest{}, []string{kept.ID}, nil},
		{&pb.ListSnapshotsRequest{WithDeleted: true}, []string{kept.ID}, []string{snap.ID}},
		{&pb.ListSnapshotsRequest{WithDeleted: true, SourceVolumeId: v.ID}, []string{kept.ID}, []string{snap.ID}},
		{&pb.ListSnapshotsRequest{WithDeleted: true, SourceVolumeId: "vol-00000000000000000000"}, nil, nil},
		{&pb.ListSnapshotsRequest{WithDeleted: true, SnapshotId: kept.ID}, []string{kept.ID}, nil},
		{&pb.ListSnapshotsRequest{DeletedOnly: true}, nil, []string{snap.ID}},
	} {
		copies, records := list(c.req)
		if !slices.Equal(copies, c.wantCopies) || !slices.Equal(records, c.wantRecds) {
			t.Errorf("ListSnapshots(%v): copies %v, records %v; want %v, %v", c.req, copies, records, c.wantCopies, c.wantRecds)
		}
	}
	if _, err := s.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{SnapshotId: snap.ID, Forget: true}); err != nil {
		t.Fatal(err)
	}
	if _, records := list(&pb.ListSnapshotsRequest{DeletedOnly: true}); len(records) != 0 {
		t.Errorf("records after forgetting: %v, want none", records)
	}
}

// TestRetirePeer: refused on a node that keeps no lease; otherwise the
// lease's verdict, and the count after it.
func TestRetirePeer(t *testing.T) {
	s, _, _ := newServer(t)
	ctx := context.Background()
	if _, err := s.RetirePeer(ctx, &pb.RetirePeerRequest{NodeId: "n3"}); status.Code(errdefs.ToStatus(err)) != codes.FailedPrecondition {
		t.Errorf("RetirePeer without a lease: %v, want FailedPrecondition", err)
	}
	var retired []string
	s.Retire = func(id string) error {
		if id == "n2" {
			return errdefs.Wrap(errdefs.ErrFailedPrecondition, "node n1 heard from n2 3s ago")
		}
		retired = append(retired, id)
		return nil
	}
	s.KnownNodes = func() int { return 3 - len(retired) }
	if _, err := s.RetirePeer(ctx, &pb.RetirePeerRequest{NodeId: "n2"}); status.Code(errdefs.ToStatus(err)) != codes.FailedPrecondition || !strings.Contains(err.Error(), "heard from n2") {
		t.Errorf("RetirePeer of a peer heard lately: %v, want the lease's refusal", err)
	}
	resp, err := s.RetirePeer(ctx, &pb.RetirePeerRequest{NodeId: "n3"})
	if err != nil || resp.GetKnownNodes() != 2 || len(retired) != 1 {
		t.Errorf("RetirePeer(n3) = %v, %v; want 2 nodes counted", resp, err)
	}
}

// nodeOf is a node whose parts are m's, as assembly wires them.
func nodeOf(m *volume.Manager, replicas *copyrecord.Replicas, pusher *replication.Pusher, receiver *replication.Receiver) Node {
	return Node{Volumes: m, Copies: m, Index: m.Index(), Records: m.Records(), Forcing: m.Fences(), Replicas: replicas, Pusher: pusher, Receiver: receiver}
}

// TestGetNodeReadsWhatItIsAskedFor: a GetNode reads the node's health
// (the pool's and the root dataset's) and capacity unless asked without;
// asked without health, it reads neither and reports no unhealthy reason,
// but still who the node is and which stages wait.
func TestGetNodeReadsWhatItIsAskedFor(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name          string
		req           *pb.GetNodeRequest
		wantHealth    bool // the pool's health read
		wantCapacity  bool
		wantUnhealthy bool // with the pool faulted
	}{
		{"everything", &pb.GetNodeRequest{}, true, true, true},
		{"without capacity", &pb.GetNodeRequest{WithoutCapacity: true}, true, false, true},
		{"without health", &pb.GetNodeRequest{WithoutHealth: true}, false, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, faulted := range []bool{false, true} {
				s, volumes, fake := newServer(t)
				if _, err := volumes.Create(ctx, volume.CreateRequest{Name: "data"}); err != nil {
					t.Fatal(err)
				}
				healthReads := 0
				fake.Fail = func(op, name string) error {
					if op != "pool" {
						return nil
					}
					healthReads++
					if faulted {
						return errors.New("pool tank is FAULTED")
					}
					return nil
				}
				n, err := s.GetNode(ctx, tt.req)
				fake.Fail = nil
				if err != nil {
					t.Fatal(err)
				}
				if n.GetNodeId() != "n1" || n.GetVolumesVersion() == "" {
					t.Errorf("faulted %v: the node says it is %q at volumes version %q", faulted, n.GetNodeId(), n.GetVolumesVersion())
				}
				if got := healthReads > 0; got != tt.wantHealth {
					t.Errorf("faulted %v: the pool's health read %d times", faulted, healthReads)
				}
				if got, want := n.GetUnhealthyReason() != "", faulted && tt.wantUnhealthy; got != want {
					t.Errorf("faulted %v: unhealthy reason %q", faulted, n.GetUnhealthyReason())
				}
				if got, want := n.GetVolumes() == 1 && n.GetAvailableBytes() > 0, !faulted && tt.wantCapacity; got != want {
					t.Errorf("faulted %v: %d volumes, %d bytes available", faulted, n.GetVolumes(), n.GetAvailableBytes())
				}
			}
		})
	}
}

// TestReserveRefusesAnotherWitnessSet: a node grants a generation only
// to a reservation counted over its own witness set. A controller that
// counted every node (an older one, or one whose nodes disagree) gets
// Unavailable from a node with witnesses, and so does one that counted
// witnesses from a node without.
func TestReserveRefusesAnotherWitnessSet(t *testing.T) {
	set := []string{"n1@a:7670", "n2@b:7670", "n3@c:7670"}
	parsed, err := witnesses.Parse(set)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		own         []string
		digest      string
		wantGranted bool
	}{
		{"no witnesses on either side", nil, "", true},
		{"the same set", set, parsed.Digest(), true},
		{"the node has witnesses, the controller counted every node", set, "", false},
		{"the controller counted witnesses, the node has none", nil, parsed.Digest(), false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _, _ := newServer(t)
			if s.Witnesses, err = witnesses.Parse(tt.own); err != nil {
				t.Fatal(err)
			}
			id := fmt.Sprintf("vol-%020d", i+1)
			resp, err := s.Reserve(context.Background(), &pb.ReserveRequest{VolumeId: id, Generation: 1, HolderNodeId: "n1", WitnessDigest: tt.digest})
			if tt.wantGranted {
				if err != nil || !resp.GetGranted() {
					t.Fatalf("Reserve = %v, %v; want granted", resp, err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "list the same witnesses") {
				t.Fatalf("Reserve = %v, %v; want Unavailable saying the sets differ", resp, err)
			}
		})
	}
}
