package volume

import (
	"context"
	"errors"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
)

// TestUnconfirmedPrimariesAreNotStaged: a node that restarted (a new
// Manager over the same pool) stages an unmounted primary only once it
// was confirmed current, and a lost lease forgets every confirmation. A
// mounted primary is staged (re-staged) at once. Found by the
// fault-injection simulation (seed 37 with replays weighted up): a node
// that lost power during a failover came back with its old primary and
// staged it for a replayed publish context of the old generation.
func TestUnconfirmedPrimariesAreNotStaged(t *testing.T) {
	ctx := context.Background()
	before, fake := newManager(t)
	idle := create(t, before, CreateRequest{Name: "idle"})
	mounted := create(t, before, CreateRequest{Name: "mounted"})
	before.RequireConfirmation()
	if _, unlock, err := before.Stageable(ctx, idle.ID, 1); err != nil {
		t.Fatalf("a volume this process created: %v, want it stageable", err)
	} else {
		unlock()
	}

	m := NewManager(fake, before.cfg, before.log) // the process restarts
	m.RequireConfirmation()
	m.Mounted = func(ds string) (bool, error) { return ds == mounted.Dataset, nil }
	if _, _, err := m.Stageable(ctx, idle.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("an unconfirmed primary after a restart: %v, want Unavailable", err)
	}
	if _, unlock, err := m.Stageable(ctx, mounted.ID, 1); err != nil {
		t.Errorf("a mounted primary after a restart: %v, want it stageable", err)
	} else {
		unlock()
	}
	pending, err := m.Unconfirmed(ctx)
	if err != nil || len(pending) != 2 || pending[idle.ID] != 1 {
		t.Fatalf("Unconfirmed = %v (%v), want both volumes at generation 1", pending, err)
	}
	m.Confirm(idle.ID, 2) // a confirmation of another generation
	if _, _, err := m.Stageable(ctx, idle.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("confirmed at another generation: %v, want Unavailable", err)
	}
	m.Confirm(idle.ID, 1)
	if _, unlock, err := m.Stageable(ctx, idle.ID, 1); err != nil {
		t.Errorf("a confirmed primary: %v, want it stageable", err)
	} else {
		unlock()
	}
	m.ForgetConfirmations() // the lease was lost
	if _, _, err := m.Stageable(ctx, idle.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("after the lease was lost: %v, want Unavailable", err)
	}
}
