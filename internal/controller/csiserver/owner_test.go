package csiserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// TestOwnerSecretsKeepTenantsApart: a volume created with an owner secret
// answers every call that reaches or changes its data only with that
// secret. Another tenant's create of the same name (another Nomad
// namespace) is AlreadyExists; its registration, snapshot, clone,
// expansion and deletes are PermissionDenied and change nothing; no
// answer carries the secret's digest.
func TestOwnerSecretsKeepTenantsApart(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30})
	ctx := context.Background()
	ctl := tc.controller()
	owner := map[string]string{contract.SecretOwner: "owner-a-0123456789abcdef"}
	other := map[string]string{contract.SecretOwner: "owner-b-0123456789abcdef"}
	none := map[string]string(nil)

	created, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "data", VolumeCapabilities: mountCap, Secrets: owner})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetVolume().GetVolumeId()
	snap, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: id, Secrets: owner})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()
	fromSnapshot := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snapID}}}
	fromVolume := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}

	calls := []struct {
		name string
		call func(secrets map[string]string) error
		want codes.Code // without the owner's secret
	}{
		{"create of the same name", func(s map[string]string) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "data", VolumeCapabilities: mountCap, Secrets: s})
			return err
		}, codes.AlreadyExists},
		{"registration", func(s map[string]string) error {
			_, err := ctl.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: mountCap, Secrets: s})
			return err
		}, codes.PermissionDenied},
		{"snapshot", func(s map[string]string) error {
			_, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s2", SourceVolumeId: id, Secrets: s})
			return err
		}, codes.PermissionDenied},
		{"clone of a snapshot", func(s map[string]string) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "from-snapshot", VolumeCapabilities: mountCap, VolumeContentSource: fromSnapshot, Secrets: s})
			return err
		}, codes.PermissionDenied},
		{"clone of the volume", func(s map[string]string) error {
			_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "from-volume", VolumeCapabilities: mountCap, VolumeContentSource: fromVolume, Secrets: s})
			return err
		}, codes.PermissionDenied},
		{"expansion", func(s map[string]string) error {
			_, err := ctl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}, Secrets: s})
			return err
		}, codes.PermissionDenied},
	}
	for _, c := range calls {
		for _, wrong := range []map[string]string{other, none} {
			err := c.call(wrong)
			if status.Code(err) != c.want {
				t.Errorf("%s with secrets %v: %v, want %v", c.name, wrong != nil, err, c.want)
			}
			if strings.Contains(status.Convert(err).Message(), contract.OwnerDigest(owner[contract.SecretOwner])) {
				t.Errorf("%s: the answer carries the owner's digest: %v", c.name, err)
			}
		}
		if err := c.call(owner); err != nil {
			t.Errorf("%s with the owner's secret: %v", c.name, err)
		}
	}

	// The deletes last: refused, they leave everything; the owner's go.
	if _, err := ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID, Secrets: other}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("snapshot delete by another: %v, want PermissionDenied", err)
	}
	if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("volume delete without the secret: %v, want PermissionDenied", err)
	}
	if _, err := ctl.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: mountCap, Secrets: owner}); err != nil {
		t.Fatalf("the refused delete removed the volume: %v", err)
	}
	if _, err := ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snapID, Secrets: owner}); err != nil {
		t.Errorf("snapshot delete by the owner: %v", err)
	}
	for _, clone := range []string{"from-snapshot", "from-volume"} {
		if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: contract.VolumeIDForName(clone), Secrets: owner}); err != nil {
			t.Errorf("delete of clone %s by the owner: %v", clone, err)
		}
	}
	if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id, Secrets: owner}); err != nil {
		t.Errorf("volume delete by the owner: %v", err)
	}
}

// TestOwnerSecretsAreTheSecretsOwn: the digest comes only from the
// secret, which must be long enough not to be guessed from it.
func TestOwnerSecretsAreTheSecretsOwn(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30})
	ctx := context.Background()
	ctl := tc.controller()
	digest := contract.OwnerDigest("owner-a-0123456789abcdef")
	for _, req := range []*csi.CreateVolumeRequest{
		{Name: "short", VolumeCapabilities: mountCap, Secrets: map[string]string{contract.SecretOwner: "short"}},
		{Name: "forged", VolumeCapabilities: mountCap, Parameters: map[string]string{contract.ParamOwnerDigest: digest}},
	} {
		_, err := ctl.CreateVolume(ctx, req)
		wantCode(t, err, codes.InvalidArgument)
	}
}

// TestARestoreHasItsBackupsOwner: a backup of a volume with an owner
// secret restores (backups_as_snapshots) only with that secret.
func TestARestoreHasItsBackupsOwner(t *testing.T) {
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30})
	ctx := context.Background()
	b := oneBackup{agentclient.Backup{Target: "vault", VolumeID: contract.VolumeIDForName("gone"), Snapshot: "zn-1", Received: time.Unix(1796294546, 0),
		Parameters: map[string]string{contract.ParamOwnerDigest: contract.OwnerDigest("owner-a-0123456789abcdef")}}}
	ctl := tc.controller()
	ctl.UseTargets(b, true)
	from := &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: b.b.Ref().SnapshotID()}}}
	for _, secrets := range []map[string]string{nil, {contract.SecretOwner: "owner-b-0123456789abcdef"}} {
		_, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "back", VolumeCapabilities: mountCap, VolumeContentSource: from, Secrets: secrets})
		wantCode(t, err, codes.PermissionDenied)
	}
}

// TestASnapshotOutlivingItsVolumeKeepsItsOwner: a snapshot's owner is
// read from the copy it is on, so with its volume deleted and a node
// away, a delete of a snapshot of an owned volume still needs the
// owner's secret, and one of a volume without an owner needs none.
func TestASnapshotOutlivingItsVolumeKeepsItsOwner(t *testing.T) {
	const secret = "owner-a-0123456789abcdef"
	for _, owned := range []bool{false, true} {
		tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30, "n3": 4 << 30})
		ctx := context.Background()
		ctl := tc.controller()
		var owner map[string]string
		if owned {
			owner = map[string]string{contract.SecretOwner: secret}
		}
		created, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "data", VolumeCapabilities: mountCap, Secrets: owner, Parameters: map[string]string{"node": "n1"}})
		if err != nil {
			t.Fatal(err)
		}
		id := created.GetVolume().GetVolumeId()
		snap, err := ctl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: id, Secrets: owner})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id, Secrets: owner}); err != nil {
			t.Fatal(err)
		}
		tc.stop("n3")
		del := func(secrets map[string]string) error {
			_, err := ctl.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId(), Secrets: secrets})
			return err
		}
		if owned {
			if err := del(nil); status.Code(err) != codes.PermissionDenied {
				t.Errorf("owned: a delete without the secret, its volume gone and n3 away: %v, want PermissionDenied", err)
			}
		}
		if err := del(owner); err != nil {
			t.Errorf("owned %v: the owner's delete with its volume gone and n3 away: %v", owned, err)
		}
	}
}

// TestAReplicaKeepsItsVolumesOwner: with the primary gone (its node lost
// for good) and a replica left on a node that answers, the replica's
// recorded owner still guards the volume: a delete without the secret is
// PermissionDenied and leaves the replica; the owner's removes it.
func TestAReplicaKeepsItsVolumesOwner(t *testing.T) {
	ctx := context.Background()
	tc := newTestCluster(t, map[string]uint64{"n1": 4 << 30, "n2": 4 << 30})
	id := contract.VolumeIDForName("v")
	const secret = "owner-a-0123456789abcdef"
	replica := tc.copyOf("n2", id, contract.RoleReplica, 1)
	params := copyrecord.EncodeParameters(map[string]string{contract.ParamOwnerDigest: contract.OwnerDigest(secret)})
	if err := tc.fakes["n2"].SetProperties(ctx, replica, map[string]string{copyrecord.PropParameters: params}); err != nil {
		t.Fatal(err)
	}
	ctl := tc.controller()
	for _, secrets := range []map[string]string{nil, {contract.SecretOwner: "owner-b-0123456789abcdef"}} {
		_, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id, Secrets: secrets})
		wantCode(t, err, codes.PermissionDenied)
		if _, err := tc.fakes["n2"].Get(ctx, replica); err != nil {
			t.Fatalf("a refused delete removed the replica: %v", err)
		}
	}
	if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id, Secrets: map[string]string{contract.SecretOwner: secret}}); err != nil {
		t.Fatalf("the owner's delete: %v", err)
	}
}
