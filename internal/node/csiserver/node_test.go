package csiserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/mount"
	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// capability is a single-node-writer file system.
var capability = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// newTestNode returns a node service over the ZFS fake and an in-memory
// mount table, with one volume, whose only mount base directory is base.
func newTestNode(t *testing.T) (n *Node, mounter *mount.Fake, fake *zfsfake.Fake, v volume.Volume, base string) {
	t.Helper()
	ctx := context.Background()
	fake = zfsfake.New(10<<30, "tank")
	if err := fake.CreateFilesystem(ctx, "tank/nomad", nil); err != nil {
		t.Fatal(err)
	}
	base = t.TempDir()
	cfg := config.DefaultNode()
	cfg.NodeID, cfg.RootDataset, cfg.MaxQuota, cfg.MountBaseDirs = "n1", "tank/nomad", 1<<30, []string{base}
	volumes := volume.NewManager(volume.Deps{ZFS: fake, Config: cfg, Log: hclog.NewNullLogger()})
	v, err := volumes.Create(ctx, volume.CreateRequest{Name: "v"})
	if err != nil {
		t.Fatal(err)
	}
	mounter = mount.NewFake()
	return New(volumes, mounter, cfg, hclog.NewNullLogger()), mounter, fake, v, base
}

// TestNodeRefusesHostPaths: staging and target paths outside the
// operator's base directories, relative, unclean or through a symbolic
// link are InvalidArgument, and nothing is mounted or unmounted.
func TestNodeRefusesHostPaths(t *testing.T) {
	ctx := context.Background()
	n, mounter, _, v, base := newTestNode(t)
	if err := os.Symlink("/etc", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(base, "staging")
	bad := []string{"/etc", "relative/target", base + "/x/../../etc", filepath.Join(base, "link"), filepath.Join(base, "link", "target"), "/var/lib/elsewhere/target"}
	for _, path := range bad {
		_, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: path, VolumeCapability: capability})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("NodeStageVolume at %q: %v, want InvalidArgument", path, err)
		}
		_, err = n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, TargetPath: path, VolumeCapability: capability})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("NodePublishVolume to %q: %v, want InvalidArgument", path, err)
		}
		_, err = n.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.ID, TargetPath: path})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("NodeUnpublishVolume of %q: %v, want InvalidArgument", path, err)
		}
		_, err = n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.ID, StagingTargetPath: path})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("NodeUnstageVolume of %q: %v, want InvalidArgument", path, err)
		}
	}
	if calls := mounter.Calls(); len(calls) > 0 {
		t.Errorf("refused paths still reached the mount table: %q", calls)
	}
	if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, VolumeCapability: capability}); err != nil {
		t.Errorf("NodeStageVolume below the base directory: %v", err)
	}
}

// TestStalePublishContextRefused: a copy staged at generation 1, whose
// volume has since gone to generation 2 elsewhere (its label changed
// here), is refused by NodeStage even though it is staged already, and by
// NodePublish, when asked with the old publish context.
func TestStalePublishContextRefused(t *testing.T) {
	ctx := context.Background()
	n, _, fake, v, base := newTestNode(t)
	staging, target := filepath.Join(base, "staging"), filepath.Join(base, "target")
	gen1 := map[string]string{contract.PublishContextGeneration: "1"}
	if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, VolumeCapability: capability, PublishContext: gen1}); err != nil {
		t.Fatal(err)
	}
	if err := fake.SetProperties(ctx, v.Dataset, map[string]string{copyrecord.PropGeneration: "2"}); err != nil {
		t.Fatal(err)
	}
	_, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, VolumeCapability: capability, PublishContext: gen1})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("NodeStageVolume of a staged copy with a stale generation: %v, want FailedPrecondition", err)
	}
	_, err = n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability, PublishContext: gen1})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("NodePublishVolume with a stale generation: %v, want FailedPrecondition", err)
	}
	gen2 := map[string]string{contract.PublishContextGeneration: "2"}
	if _, err := n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability, PublishContext: gen2}); err != nil {
		t.Errorf("NodePublishVolume with the current generation: %v", err)
	}
}

// awaitedStage polls the stages waiting for a promotion on n until there
// is one, or for at most within, and returns the last answer.
func awaitedStage(n *Node, within time.Duration) []volume.AwaitedPromotion {
	giveUp := time.Now().Add(within)
	for {
		a := manager(n).AwaitedPromotions()
		if len(a) > 0 || time.Now().After(giveUp) {
			return a
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAStageGrantedAheadWaitsForThePromotion: a publish granted ahead of
// the end of the volume's move here names the source's generation; the
// stage waits, holding no lock, until the copy here is the primary of a
// newer one and then mounts it, and gives up with Unavailable (Nomad
// retries it) before the call's deadline if it never is. A context naming
// both keys is refused.
func TestAStageGrantedAheadWaitsForThePromotion(t *testing.T) {
	after1 := map[string]string{contract.PublishContextAfterGeneration: "1"}
	tests := []struct {
		name     string
		pc       map[string]string
		promote  map[string]string // the move's promotion, a moment into the wait (nil: none)
		deadline time.Duration
		want     codes.Code
	}{
		{"promoted during the wait", after1, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropGeneration: "2"}, 20 * time.Second, codes.OK},
		{"never promoted", after1, nil, 3 * time.Second, codes.Unavailable},
		// A full receive creating the copy: ZFS cannot open it (EBUSY).
		{"busy while received, then promoted", after1, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropGeneration: "2"}, 20 * time.Second, codes.OK},
		{"a primary of the source's generation is no promotion", after1, map[string]string{copyrecord.PropRole: contract.RolePrimary, copyrecord.PropGeneration: "1"}, 3 * time.Second, codes.Unavailable},
		{"both keys", map[string]string{contract.PublishContextAfterGeneration: "1", contract.PublishContextGeneration: "2"}, nil, 3 * time.Second, codes.InvalidArgument},
		{"not a generation", map[string]string{contract.PublishContextAfterGeneration: "x"}, nil, 3 * time.Second, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, mounter, fake, v, base := newTestNode(t)
			bg := context.Background()
			if strings.HasPrefix(tc.name, "busy") {
				busyUntil := time.Now().Add(900 * time.Millisecond)
				fake.Fail = func(op, name string) error {
					if name == v.Dataset && op == "get" && time.Now().Before(busyUntil) {
						return fmt.Errorf("zfs open %s: dataset is busy: %w", name, zfs.ErrBusy)
					}
					return nil
				}
			}
			// The move's target holds a replica of the source's generation.
			if err := fake.SetProperties(bg, v.Dataset, map[string]string{copyrecord.PropRole: contract.RoleReplica, copyrecord.PropGeneration: "1"}); err != nil {
				t.Fatal(err)
			}
			promoted := make(chan struct{})
			var promotionBegan time.Time // read after promoted is closed
			if tc.promote == nil {
				close(promoted)
			} else {
				go func() {
					defer close(promoted)
					// The node tells that a stage waits here once the
					// stage waits, however slow the machine.
					if a := awaitedStage(n, tc.deadline); len(a) != 1 || a[0].VolumeID != v.ID || a[0].AfterGeneration != 1 {
						t.Errorf("the stages waiting for a promotion, during the wait: %+v", a)
						return
					}
					// The promotion takes the copy's lock: the waiting
					// stage must not hold it.
					lctx, lcancel := context.WithTimeout(bg, time.Second)
					defer lcancel()
					unlock, err := manager(n).Locks().Lock(lctx, v.ID, "promote")
					if err != nil {
						t.Errorf("the promotion could not take the copy's lock during the stage's wait: %v", err)
						return
					}
					defer unlock()
					promotionBegan = time.Now()
					if err := fake.SetProperties(bg, v.Dataset, tc.promote); err != nil {
						t.Error(err)
					}
				}()
			}
			ctx, cancel := context.WithTimeout(bg, tc.deadline)
			defer cancel()
			staging := filepath.Join(base, "staging")
			began := time.Now()
			_, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, VolumeCapability: capability, PublishContext: tc.pc})
			if status.Code(err) != tc.want {
				t.Fatalf("NodeStageVolume: %v, want %v", err, tc.want)
			}
			answered := time.Now()
			if ctx.Err() != nil {
				t.Errorf("NodeStageVolume answered after its deadline (%v)", answered.Sub(began))
			}
			<-promoted
			if a := manager(n).AwaitedPromotions(); len(a) != 0 {
				t.Errorf("the stages waiting for a promotion, after the stage answered: %+v", a)
			}
			_, mounted, _ := mounter.Lookup(staging)
			if mounted != (tc.want == codes.OK) {
				t.Errorf("staged: %v, want %v", mounted, tc.want == codes.OK)
			}
			if tc.want != codes.OK {
				return
			}
			if answered.Before(promotionBegan) {
				t.Errorf("staged %v before the copy's promotion began", promotionBegan.Sub(answered))
			}
			target := filepath.Join(base, "target")
			if _, err := n.NodePublishVolume(bg, &csi.NodePublishVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability, PublishContext: tc.pc}); err != nil {
				t.Errorf("NodePublishVolume with the same context once promoted: %v", err)
			}
		})
	}
}

// TestAnEncryptedVolumeIsOpenOnlyWhileStaged: a stage without the key or
// with a wrong one is InvalidArgument and mounts nothing; the right key
// (from the stage's secrets) is loaded for the mount, and unstaging
// unloads it.
func TestAnEncryptedVolumeIsOpenOnlyWhileStaged(t *testing.T) {
	ctx := context.Background()
	n, mounter, fake, _, base := newTestNode(t)
	n.cfg.Properties["encryption"] = config.PropertyRule{}
	n.volumes = volume.NewManager(volume.Deps{ZFS: fake, Config: n.cfg, Log: hclog.NewNullLogger(),
		Host: volume.Host{Encryption: fake, Mounted: func(ds string) (bool, error) { return mounter.Mounted(ds), nil }}})
	key := "correct horse battery"
	v, err := manager(n).Create(ctx, volume.CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(key)})
	if err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(base, "staging")
	stage := func(secrets map[string]string) error {
		_, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, VolumeCapability: capability, Secrets: secrets})
		return err
	}
	keyLoaded := func() bool {
		got, err := manager(n).Get(ctx, v.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.KeyLoaded
	}
	for _, secrets := range []map[string]string{nil, {contract.SecretEncryptionKey: "wrong passphrase"}} {
		if err := stage(secrets); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("stage with secrets %v: %v, want InvalidArgument", secrets, err)
		}
		if calls := mounter.Calls(); len(calls) > 0 || keyLoaded() {
			t.Fatalf("a stage without the right key mounted %q or loaded the key (%v)", calls, keyLoaded())
		}
	}
	if err := stage(map[string]string{contract.SecretEncryptionKey: key}); err != nil {
		t.Fatal(err)
	}
	if !keyLoaded() {
		t.Fatal("staged without the key loaded")
	}
	if _, err := n.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if keyLoaded() {
		t.Fatal("unstaged with the key still loaded")
	}
}

// TestAStageWithoutTheKeyIsRefusedWhileTheKeyIsLoaded: a stage checks
// its passphrase against the volume's key even when the key is loaded
// (the volume staged at another path, or a stage repeated): a wrong or
// missing one is InvalidArgument, mounts nothing, and leaves the staged
// path and its key as they were.
func TestAStageWithoutTheKeyIsRefusedWhileTheKeyIsLoaded(t *testing.T) {
	const key = "correct horse battery"
	tests := []struct {
		name    string
		path    string // the staging path of the second stage, in base
		secrets map[string]string
		want    codes.Code
	}{
		{"second path, wrong key", "second", map[string]string{contract.SecretEncryptionKey: "wrong passphrase"}, codes.InvalidArgument},
		{"second path, no key", "second", nil, codes.InvalidArgument},
		{"same path again, wrong key", "first", map[string]string{contract.SecretEncryptionKey: "wrong passphrase"}, codes.InvalidArgument},
		{"second path, its key", "second", map[string]string{contract.SecretEncryptionKey: key}, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			n, mounter, fake, _, base := newTestNode(t)
			n.cfg.Properties["encryption"] = config.PropertyRule{}
			n.volumes = volume.NewManager(volume.Deps{ZFS: fake, Config: n.cfg, Log: hclog.NewNullLogger(),
				Host: volume.Host{Encryption: fake, Mounted: func(ds string) (bool, error) { return mounter.Mounted(ds), nil }}})
			v, err := manager(n).Create(ctx, volume.CreateRequest{Name: "secret", Parameters: map[string]string{"encryption": "on"}, Passphrase: contract.Passphrase(key)})
			if err != nil {
				t.Fatal(err)
			}
			stage := func(path string, secrets map[string]string) error {
				_, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: filepath.Join(base, path), VolumeCapability: capability, Secrets: secrets})
				return err
			}
			if err := stage("first", map[string]string{contract.SecretEncryptionKey: key}); err != nil {
				t.Fatal(err)
			}
			before := len(mounter.Calls())
			err = stage(tt.path, tt.secrets)
			if status.Code(err) != tt.want {
				t.Fatalf("a stage at %s with the key loaded: %v, want %v", tt.path, err, tt.want)
			}
			if tt.want != codes.OK {
				if calls := mounter.Calls()[before:]; len(calls) > 0 {
					t.Errorf("a refused stage did %q", calls)
				}
				if _, mounted, _ := mounter.Lookup(filepath.Join(base, "second")); mounted {
					t.Error("a refused stage mounted the second path")
				}
			}
			if !fake.KeyLoaded(v.Dataset) {
				t.Error("the key of the volume staged at the first path was unloaded")
			}
		})
	}
}

// TestAVolumeWithAnOwnerIsStagedAndPublishedOnlyWithItsSecret: the node
// holds the data, so its stage and publish are where an owner secret is
// decisive: without it, or with another, each is PermissionDenied and
// mounts nothing.
func TestAVolumeWithAnOwnerIsStagedAndPublishedOnlyWithItsSecret(t *testing.T) {
	const secret = "owner-a-0123456789abcdef"
	owner := map[string]string{contract.SecretOwner: secret}
	tests := []struct {
		name    string
		secrets map[string]string
		want    codes.Code
	}{
		{"no secret", nil, codes.PermissionDenied},
		{"another owner's", map[string]string{contract.SecretOwner: "owner-b-0123456789abcdef"}, codes.PermissionDenied},
		{"the owner's", owner, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			n, mounter, _, _, base := newTestNode(t)
			v, err := manager(n).Create(ctx, volume.CreateRequest{Name: "owned", Parameters: map[string]string{contract.ParamOwnerDigest: contract.OwnerDigest(secret)}})
			if err != nil {
				t.Fatal(err)
			}
			staging, target := filepath.Join(base, "staging"), filepath.Join(base, "target")
			_, err = n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, VolumeCapability: capability, Secrets: tt.secrets})
			if status.Code(err) != tt.want {
				t.Fatalf("stage: %v, want %v", err, tt.want)
			}
			if tt.want != codes.OK {
				if calls := mounter.Calls(); len(calls) > 0 {
					t.Errorf("a refused stage did %q", calls)
				}
				// Staged by its owner, the volume is still published
				// only to its owner.
				if _, err := n.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, VolumeCapability: capability, Secrets: owner}); err != nil {
					t.Fatal(err)
				}
			}
			before := len(mounter.Calls())
			_, err = n.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.ID, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability, Secrets: tt.secrets})
			if status.Code(err) != tt.want {
				t.Fatalf("publish: %v, want %v", err, tt.want)
			}
			if calls := mounter.Calls()[before:]; tt.want != codes.OK && len(calls) > 0 {
				t.Errorf("a refused publish did %q", calls)
			}
		})
	}
}

// manager is the volume manager n serves, as zfs-node gives it.
func manager(n *Node) *volume.Manager { return n.volumes.(*volume.Manager) }
