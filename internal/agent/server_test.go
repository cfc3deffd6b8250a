package agent

import (
	"context"
	"slices"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/config"
	"github.com/zfs-nomad/zfs-nomad/internal/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs/zfsfake"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

const root = "tank/nomad"

func newServer(t *testing.T) (*Server, *volume.Manager, *zfsfake.Fake) {
	t.Helper()
	fake := zfsfake.New(10<<30, "tank")
	if err := fake.CreateFilesystem(context.Background(), root, nil); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultNode()
	cfg.NodeID, cfg.RootDataset = "n1", root
	cfg.MaxQuota, cfg.DefaultQuota = 4<<30, 1<<30
	log := hclog.NewNullLogger()
	volumes := volume.NewManager(fake, cfg, log)
	receiver := replication.NewReceiver(fake.Streams(), volumes.Locks(), root, cfg.NodeID, cfg.ReplicationSnapshots, log)
	return NewServer(volumes, nil, receiver, cfg, log), volumes, fake
}

// TestChangesTellsWhatBecameOfEachChangedVolume (issue 13): the schedule's
// round after a change asks the node what changed since the version it
// saw; the node answers, for each volume changed since, its primary or
// its replica here now, or neither; and cannot tell for another
// process's version.
func TestChangesTellsWhatBecameOfEachChangedVolume(t *testing.T) {
	ctx := context.Background()
	s, volumes, fake := newServer(t)
	kept, err := volumes.Create(ctx, volume.CreateRequest{Name: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	since := volumes.VolumesVersion()
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
		volume.PropVolumeID: replicaID, volume.PropRole: replication.RoleReplica, volume.PropName: "theirs"}); err != nil {
		t.Fatal(err)
	}
	volumes.NoteChanged(replicaID)

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
