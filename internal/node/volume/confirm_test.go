package volume

import (
	"context"
	"errors"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestUnconfirmedPrimariesAreNotStaged: a node that restarted (a new
// Manager over the same pool) stages a primary only once it was confirmed
// current, and a lost lease forgets every confirmation. A node that lost
// power during a failover comes back with its old primary, and a replayed
// publish context of the old generation must not stage it (the
// fault-injection simulation reaches this with seed 37 and replays
// weighted up). A mounted primary is no exception: a zfs-node killed
// during a partition leaves the mount to the kernel, the volume is failed
// over, and the returning process must not stage the mount for its old
// publish context; only a mount this process staged is re-staged at once.
func TestUnconfirmedPrimariesAreNotStaged(t *testing.T) {
	ctx := context.Background()
	before, fake := newManager(t)
	idle := create(t, before, CreateRequest{Name: "idle"})
	mounted := create(t, before, CreateRequest{Name: "mounted"})
	before.fences.RequireConfirmation()
	if _, unlock, err := before.Stageable(ctx, idle.ID, 1); err != nil {
		t.Fatalf("a volume this process created: %v, want it stageable", err)
	} else {
		unlock()
	}

	m := NewManager(Deps{ZFS: fake, Config: before.cfg, Log: before.log}) // the process restarts
	m.fences.RequireConfirmation()
	m.host.Mounted = func(ds string) (bool, error) { return ds == mounted.Dataset, nil }
	if _, _, err := m.Stageable(ctx, idle.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("an unconfirmed primary after a restart: %v, want Unavailable", err)
	}
	if _, unlock, err := m.Stageable(ctx, mounted.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		if err == nil {
			unlock()
		}
		t.Errorf("a mounted, unconfirmed primary after a restart, with its old publish context: %v, want Unavailable", err)
	}
	pending, err := m.fences.Unconfirmed(ctx)
	if err != nil || len(pending) != 2 || pending[idle.ID] != 1 || pending[mounted.ID] != 1 {
		t.Fatalf("Unconfirmed = %v (%v), want both volumes, the mounted one too, at generation 1", pending, err)
	}
	m.fences.Confirm(mounted.ID, 1) // the first beat
	// Staged by this process, then its stage run again.
	for range 2 {
		_, unlock, err := m.Stageable(ctx, mounted.ID, 1)
		if err != nil {
			t.Fatalf("a mounted primary confirmed by this process: %v, want it stageable", err)
		}
		unlock()
	}
	m.fences.Confirm(idle.ID, 2) // a confirmation of another generation
	if _, _, err := m.Stageable(ctx, idle.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("confirmed at another generation: %v, want Unavailable", err)
	}
	m.fences.Confirm(idle.ID, 1)
	if _, unlock, err := m.Stageable(ctx, idle.ID, 1); err != nil {
		t.Errorf("a confirmed primary: %v, want it stageable", err)
	} else {
		unlock()
	}
	m.fences.ForgetConfirmations() // the lease was lost
	if _, _, err := m.Stageable(ctx, idle.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("after the lease was lost: %v, want Unavailable", err)
	}
}
