package volume

import (
	"context"
	"maps"
	"strconv"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// The set-up the package's tests share.

const root = "tank/nomad"

func newManager(t *testing.T) (*Manager, *zfsfake.Fake) {
	t.Helper()
	fake := zfsfake.New(10<<30, "tank")
	if err := fake.CreateFilesystem(context.Background(), root, nil); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultNode()
	cfg.NodeID = "n1"
	cfg.RootDataset = root
	cfg.MaxQuota = 4 << 30
	cfg.DefaultQuota = 1 << 30
	cfg.Properties = map[string]config.PropertyRule{
		"compression": {Default: "lz4", Allowed: []string{"lz4", "off", "zstd"}},
		"atime":       {},
	}
	cfg.BackupTargets = map[string]string{"vault": "vault.example:7680", "offsite": "10.0.0.9:7680"}
	return NewManager(Deps{ZFS: fake, Config: cfg, Log: hclog.NewNullLogger()}), fake
}

// wantOnlyRoot fails the test unless the fake holds only the pool and the
// root dataset: every volume, snapshot and tombstone is gone. when says
// after what.
func wantOnlyRoot(t *testing.T, fake *zfsfake.Fake, when string) {
	t.Helper()
	if names := fake.Names(); len(names) != 2 {
		t.Errorf("%s: datasets left: %v, want only tank and %s", when, names, root)
	}
}

// create creates a volume and fails the test if that fails.
func create(t *testing.T, m *Manager, req CreateRequest) Volume {
	t.Helper()
	v, err := m.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// snapshot takes CSI snapshot name of volume id and fails the test if
// that fails.
func snapshot(t *testing.T, m *Manager, id, name string) Snapshot {
	t.Helper()
	s, err := m.CreateSnapshot(context.Background(), id, name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// putCopy puts a copy of volume name in the fake as a receive or an
// earlier process left it: role at generation gen, with the driver's
// labels and props on top. It returns the volume's ID and dataset.
func putCopy(t *testing.T, fake *zfsfake.Fake, name, role string, gen uint64, props map[string]string) (id, ds string) {
	t.Helper()
	id = contract.VolumeIDForName(name)
	ds = root + "/" + id
	all := map[string]string{copyrecord.PropVolumeID: id, copyrecord.PropRole: role, copyrecord.PropGeneration: strconv.FormatUint(gen, 10), copyrecord.PropName: name}
	maps.Copy(all, props)
	if err := fake.CreateFilesystem(context.Background(), ds, all); err != nil {
		t.Fatal(err)
	}
	return id, ds
}
