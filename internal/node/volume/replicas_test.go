package volume

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestDeleteReplica: a replica goes with its replication snapshots and
// holds; one holding a CSI snapshot becomes a tombstone instead, holding
// that snapshot alone, and the snapshot index finds the snapshot there
// as soon as DeleteReplica returns (it moved under the copy's lock). A
// primary is not a replica to delete, and neither is an ID that names
// no volume.
func TestDeleteReplica(t *testing.T) {
	ctx := context.Background()
	csi := contract.SnapshotIDForName("before-upgrade")
	tests := []struct {
		name      string
		role      string // "": no copy
		snapshots []string
		deleted   bool
		tombstone bool
	}{
		{"a replica", contract.RoleReplica, []string{"zn-1", "zn-2"}, true, false},
		{"a replica with a CSI snapshot", contract.RoleReplica, []string{"zn-1", csi, "zn-2"}, true, true},
		{"a primary", contract.RolePrimary, []string{"zn-1", csi}, false, false},
		{"no copy", "", nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, fake := newManager(t)
			streams := fake
			m.replicas = copyrecord.NewReplicas(streams, root)
			id, fs := contract.VolumeIDForName("v"), root+"/"+contract.VolumeIDForName("v")
			if tt.role != "" {
				putCopy(t, fake, "v", tt.role, 3, nil)
				for _, snap := range tt.snapshots {
					if err := fake.Snapshot(ctx, fs+"@"+snap, nil); err != nil {
						t.Fatal(err)
					}
				}
				if tt.role == contract.RoleReplica {
					if err := streams.Hold(ctx, fs+"@zn-2", "zfs-nomad-base"); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := m.index.SnapshotPage(ctx, "", 0, ""); err != nil { // the index knows the snapshots where they are
					t.Fatal(err)
				}
			}
			deleted, err := m.DeleteReplica(ctx, id)
			if err != nil || deleted != tt.deleted {
				t.Fatalf("DeleteReplica: %v, %v; want %v", deleted, err, tt.deleted)
			}
			names := fake.Names()
			switch {
			case tt.role == contract.RolePrimary:
				if _, err := fake.Get(ctx, fs); err != nil {
					t.Errorf("the primary: %v, want it untouched", err)
				}
			case !tt.tombstone:
				if len(names) != 2 {
					t.Errorf("the pool holds %v, want the pool and the root alone", names)
				}
			default:
				wantTombstoneOf(t, m, fs, csi)
			}
		})
	}
	m, _ := newManager(t)
	if deleted, err := m.DeleteReplica(ctx, "../escape"); err != nil || deleted {
		t.Errorf("DeleteReplica of a name that is no volume ID: %v, %v; want nothing deleted", deleted, err)
	}
}

// wantTombstoneOf fails the test unless the one copy under the root is a
// tombstone of fs holding CSI snapshot csi alone, and the snapshot index
// lists csi on it.
func wantTombstoneOf(t *testing.T, m *Manager, fs, csi string) {
	t.Helper()
	ctx := context.Background()
	children, err := m.zfs.Children(ctx, root)
	if err != nil || len(children) != 1 || !strings.HasPrefix(children[0].Name, fs+"-deleted-") {
		t.Fatalf("under the root: %v (%v), want one tombstone of %s", children, err, fs)
	}
	tomb := children[0].Name
	if role, _, err := m.zfs.UserProperty(ctx, tomb, copyrecord.PropRole); err != nil || role != contract.RoleDeleted {
		t.Errorf("the tombstone's role: %q (%v), want %q", role, err, contract.RoleDeleted)
	}
	if snaps, err := m.zfs.SnapshotNames(ctx, tomb); err != nil || len(snaps) != 1 || snaps[0] != tomb+"@"+csi {
		t.Errorf("the tombstone's snapshots: %v (%v), want %s alone", snaps, err, csi)
	}
	listed, err := m.index.SnapshotPage(ctx, "", 0, "")
	if err != nil || len(listed) != 1 || listed[0].Dataset != tomb+"@"+csi {
		t.Errorf("the snapshot index lists %+v (%v), want %s on the tombstone", listed, err, csi)
	}
}

// TestDeleteSurplusRefusesWithoutChange: a replica that is not a surplus
// copy (here: never demoted by a move) is FailedPrecondition, says why,
// and stays as it was.
func TestDeleteSurplusRefusesWithoutChange(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	m.replicas = copyrecord.NewReplicas(fake, root)
	id, fs := putCopy(t, fake, "v", contract.RoleReplica, 3, nil)
	if err := fake.Snapshot(ctx, fs+"@zn-2", nil); err != nil {
		t.Fatal(err)
	}
	deleted, err := m.DeleteSurplus(ctx, id, "zn-2", nil)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || deleted || !strings.Contains(err.Error(), "not demoted") {
		t.Fatalf("DeleteSurplus of a replica never demoted: %v, %v; want FailedPrecondition saying why", deleted, err)
	}
	if _, err := fake.Get(ctx, fs); err != nil {
		t.Errorf("the replica after the refusal: %v, want it kept", err)
	}
}
