package copyrecord

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// TestInventory: Holdings reports the replicas under the root, each with
// its newest snapshot and whether it was demoted by a move, and the
// copies set aside; primaries, tombstones and a replacement labelled but
// not yet renamed into place are none of these. ReplicaOf agrees with it
// for each copy, and reads no replica of a name that is no volume ID.
func TestInventory(t *testing.T) {
	ctx := context.Background()
	const root = "tank/nomad"
	fake := zfsfake.New(10<<30, "tank")
	mustDo(t, fake.CreateFilesystem(ctx, root, nil))
	replica, demoted, primary := contract.VolumeIDForName("r"), contract.VolumeIDForName("d"), contract.VolumeIDForName("p")
	copies := []struct {
		name      string
		props     map[string]string
		snapshots []string
	}{
		{root + "/" + replica, map[string]string{PropVolumeID: replica, PropRole: contract.RoleReplica, PropName: "r"}, []string{"zn-1", "zn-2"}},
		{root + "/" + demoted, map[string]string{PropVolumeID: demoted, PropRole: contract.RoleReplica, PropDemotedAt: "1800000000"}, nil},
		{root + "/" + primary, map[string]string{PropVolumeID: primary, PropRole: contract.RolePrimary}, []string{"zn-1"}},
		{root + "/" + primary + "-incoming", map[string]string{PropVolumeID: primary, PropRole: contract.RoleReplica}, nil},
		{AsideName(root+"/"+replica, time.Unix(1800000000, 0)), map[string]string{PropVolumeID: replica, PropRole: contract.RoleSetAside}, nil},
		{root + "/" + primary + "-deleted-1", map[string]string{PropVolumeID: primary, PropRole: contract.RoleDeleted}, nil},
	}
	for _, c := range copies {
		mustDo(t, fake.CreateFilesystem(ctx, c.name, c.props))
		for _, snap := range c.snapshots {
			mustDo(t, fake.Snapshot(ctx, c.name+"@"+snap, nil))
		}
	}
	r := NewReplicas(fake, root)
	replicas, setAside, err := r.Holdings(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, rep := range replicas {
		ids = append(ids, rep.VolumeID)
	}
	slices.Sort(ids)
	if want := slices.Sorted(slices.Values([]string{replica, demoted})); !slices.Equal(ids, want) {
		t.Errorf("Holdings' replicas: %v, want %v", ids, want)
	}
	if want := []string{copies[4].name}; !slices.Equal(setAside, want) {
		t.Errorf("Holdings' copies set aside: %v, want %v", setAside, want)
	}
	tests := []struct {
		id      string
		held    bool
		last    string
		demoted bool
	}{
		{replica, true, "zn-2", false},
		{demoted, true, "", true},
		{primary, false, "", false},
		{contract.VolumeIDForName("none"), false, "", false},
		{"../" + replica, false, "", false},
	}
	for _, tt := range tests {
		rep, held, err := r.ReplicaOf(ctx, tt.id)
		if err != nil || held != tt.held || rep.LastSnapshot != tt.last || rep.DemotedAt.IsZero() == tt.demoted {
			t.Errorf("ReplicaOf(%s) = %+v, %v, %v; want held %v, newest %q, demoted %v", tt.id, rep, held, err, tt.held, tt.last, tt.demoted)
		}
		if held && (rep.Resumable || (tt.id == replica && rep.Name != "r")) {
			t.Errorf("ReplicaOf(%s) = %+v: want it named as created and not resumable", tt.id, rep)
		}
	}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
