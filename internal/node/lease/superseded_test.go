package lease

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/volume"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestAReturningNodeFencesItsSupersededMount, on the node's real volume
// code: a node's zfs-node was dead through a partition in which its
// volume was failed over (generation 2 promised to n3); the kernel kept
// the mount, read-write, and the job kept writing. The process comes
// back: its first beat learns of the newer promise from a peer and must
// make the mounted copy read-only at once, and the old publish context
// (generation 1) must not stage it. A beat that only logged the promise
// would leave the copy writable and let the mount pass the stage.
func TestAReturningNodeFencesItsSupersededMount(t *testing.T) {
	ctx := context.Background()
	fake := zfsfake.New(10<<30, "tank")
	if err := fake.CreateFilesystem(ctx, "tank/nomad", nil); err != nil {
		t.Fatal(err)
	}
	cfg := config.DefaultNode()
	cfg.NodeID, cfg.RootDataset, cfg.MaxQuota, cfg.DefaultQuota = "n1", "tank/nomad", 4<<30, 1<<30
	before := volume.NewManager(volume.Deps{ZFS: fake, Config: cfg, Log: hclog.NewNullLogger()})
	v, err := before.Create(ctx, volume.CreateRequest{Name: "web-data"})
	if err != nil {
		t.Fatal(err)
	}

	// The process restarts, as zfs-node wires it with peers.
	mounted := func(ds string) (bool, error) { return ds == v.Dataset, nil }
	m := volume.NewManager(volume.Deps{ZFS: fake, Config: cfg, Log: hclog.NewNullLogger(), Host: volume.Host{Mounted: mounted}})
	monitor := NewMonitor(time.Minute, time.Now)
	monitor.RequirePeers()
	m.Fences().FollowLease(func() bool { return monitor.Held("n1") })
	m.Fences().RequireConfirmation()

	net := newMemNet()
	net.serve("n2:7670", "n2", map[string]uint64{})
	net.serve("n3:7670", "n3", map[string]uint64{v.ID: 2}) // the failover's promise
	h := &Heartbeat{
		Monitor:  monitor,
		NodeID:   "n1",
		Interval: 2 * time.Second,
		Peers:    func() ([]string, error) { return []string{"n2:7670", "n3:7670"}, nil },
		Client:   net.client("n1"),
		Volumes:  m.Fences(),
		Log:      hclog.NewNullLogger(),
	}
	h.Beat(ctx)
	if h.lost {
		t.Fatal("the lease was not held after a beat that both peers answered")
	}
	if ro := fake.NativeProperty(v.Dataset, "readonly"); ro != "on" {
		t.Errorf("the mounted copy after the beat learned of generation 2: readonly=%q, want on", ro)
	}
	_, unlock, err := m.Stageable(ctx, v.ID, 1)
	if err == nil {
		unlock()
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "generation 2") {
		t.Errorf("staging the superseded copy with its old publish context: %v, want FailedPrecondition naming generation 2", err)
	}
	h.Beat(ctx) // a second beat keeps it so
	if ro := fake.NativeProperty(v.Dataset, "readonly"); ro != "on" {
		t.Errorf("after a second beat: readonly=%q, want on", ro)
	}
	// A restart keeps the mark: the fence is on the dataset.
	again := volume.NewManager(volume.Deps{ZFS: fake, Config: cfg, Log: hclog.NewNullLogger()})
	if _, _, err := again.Stageable(ctx, v.ID, 1); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("staging after another restart: %v, want FailedPrecondition", err)
	}
}
