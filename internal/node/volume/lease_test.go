package volume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestSelfFenceAndLift: a node that lost its lease makes its mounted
// primaries read-only and stages none; a confirmation for another
// generation lifts nothing; the right one makes the volume writable and
// stageable again.
func TestSelfFenceAndLift(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	mounted := create(t, m, CreateRequest{Name: "mounted"})
	idle := create(t, m, CreateRequest{Name: "idle"})
	m.host.Mounted = func(ds string) (bool, error) { return ds == mounted.Dataset, nil }
	held := true
	m.fences.FollowLease(func() bool { return held })
	readonly := func(ds string) string {
		return fake.NativeProperty(ds, "readonly")
	}

	held = false
	fenced, err := m.fences.SelfFence(ctx)
	if err != nil || !slices.Equal(fenced, []string{mounted.ID}) {
		t.Fatalf("SelfFence fenced %v (%v), want only the mounted volume %s", fenced, err, mounted.ID)
	}
	if readonly(mounted.Dataset) != "on" || readonly(idle.Dataset) == "on" {
		t.Errorf("readonly: mounted %s, idle %s; want on and off", readonly(mounted.Dataset), readonly(idle.Dataset))
	}
	if again, err := m.fences.SelfFence(ctx); err != nil || len(again) != 0 {
		t.Errorf("a second SelfFence fenced %v (%v), want nothing", again, err)
	}
	if _, _, err := m.Stageable(ctx, idle.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("staging without the lease: %v, want Unavailable", err)
	}

	held = true
	if _, _, err := m.Stageable(ctx, mounted.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("staging a volume fenced by the lease: %v, want Unavailable", err)
	}
	if got, err := m.fences.LeaseFenced(ctx); err != nil || len(got) != 1 || got[mounted.ID] != 1 {
		t.Errorf("LeaseFenced = %v (%v), want %s at generation 1", got, err, mounted.ID)
	}
	if err := m.fences.LiftLeaseFence(ctx, mounted.ID, 2); !errors.Is(err, errdefs.ErrFailedPrecondition) || readonly(mounted.Dataset) != "on" {
		t.Errorf("lifting with another generation: %v, readonly %s; want FailedPrecondition and still on", err, readonly(mounted.Dataset))
	}
	held = false
	if err := m.Unfence(ctx, mounted.ID, 1); !errors.Is(err, errdefs.ErrUnavailable) || readonly(mounted.Dataset) != "on" {
		t.Errorf("the controller's unfence without the lease: %v, readonly %s; want Unavailable and still on", err, readonly(mounted.Dataset))
	}
	held = true
	if err := m.Unfence(ctx, mounted.ID, 1); err != nil || readonly(mounted.Dataset) != "off" {
		t.Fatalf("the controller's unfence (a publish found the copy current): %v, readonly %s; want off", err, readonly(mounted.Dataset))
	}
	_, unlock, err := m.Stageable(ctx, mounted.ID, 1)
	if err != nil {
		t.Fatalf("staging after the lift: %v", err)
	}
	unlock()
}

// TestForcedCopyIgnoresTheLease: the copy an operator promoted without a
// majority is staged and kept writable without the lease: a lone node is
// exactly where the operator forced it.
func TestForcedCopyIgnoresTheLease(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	v := create(t, m, CreateRequest{Name: "forced"})
	if err := m.fences.MarkForced(ctx, v.ID, 1); err != nil {
		t.Fatal(err)
	}
	m.host.Mounted = func(string) (bool, error) { return true, nil }
	m.fences.FollowLease(func() bool { return false })
	if fenced, err := m.fences.SelfFence(ctx); err != nil || len(fenced) != 0 || fake.NativeProperty(v.Dataset, "readonly") == "on" {
		t.Errorf("SelfFence fenced %v (%v); want the forced copy left writable", fenced, err)
	}
	_, unlock, err := m.Stageable(ctx, v.ID, 1)
	if err != nil {
		t.Fatalf("staging the forced copy without the lease: %v", err)
	}
	unlock()
}

// TestSelfFenceFencesAllAtOnce: a node that lost its lease fences every
// mounted primary at once: one volume whose lock is busy delays only
// itself, so all twenty are read-only within one lock wait and one
// switch, the allowance the lease margin makes (config.FenceAllowance),
// not one per volume.
func TestSelfFenceFencesAllAtOnce(t *testing.T) {
	const (
		primaries = 20
		busy      = time.Second            // the one busy lock is held this long
		perVolume = 150 * time.Millisecond // each volume's fence (the mount check stands in for the remount)
		bound     = busy + perVolume + 600*time.Millisecond
	)
	ctx := context.Background()
	m, fake := newManager(t)
	var vols []Volume
	for i := range primaries {
		vols = append(vols, create(t, m, CreateRequest{Name: fmt.Sprintf("v%02d", i)}))
	}
	m.host.Mounted = func(string) (bool, error) { time.Sleep(perVolume); return true, nil }
	m.fences.FollowLease(func() bool { return false })
	unlock, err := m.Locks().Lock(ctx, vols[7].ID, "a slow change")
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(busy, unlock)

	began := time.Now()
	fenced, err := m.fences.SelfFence(ctx)
	took := time.Since(began)
	if err != nil || len(fenced) != primaries {
		t.Fatalf("SelfFence fenced %d of %d (%v)", len(fenced), primaries, err)
	}
	if took > bound {
		t.Errorf("fencing %d primaries, one lock busy for %s, took %s; want within %s (all at once, not one after another)", primaries, busy, took.Round(time.Millisecond), bound)
	}
	for _, v := range vols {
		if got := fake.NativeProperty(v.Dataset, "readonly"); got != "on" {
			t.Errorf("volume %s: readonly %q after the self-fence, want on", v.ID, got)
		}
	}
}

// TestFenceSuperseded: a copy this node learns a newer generation was
// promised for elsewhere turns read-only at once, mounted or not, and is
// not staged, the error naming the newer generation; a fence for an older
// promise, of another generation or of a copy moving away changes
// nothing; the controller's Unfence (a publish found the promise unused)
// lifts it and its mark.
func TestFenceSuperseded(t *testing.T) {
	ctx := context.Background()
	m, fake := newManager(t)
	mounted := create(t, m, CreateRequest{Name: "mounted"})
	idle := create(t, m, CreateRequest{Name: "idle"})
	m.host.Mounted = func(ds string) (bool, error) { return ds == mounted.Dataset, nil }
	m.fences.FollowLease(func() bool { return true })
	readonly := func(ds string) string { return fake.NativeProperty(ds, "readonly") }

	if fenced, err := m.fences.FenceSuperseded(ctx, mounted.ID, 2, 3); err != nil || fenced {
		t.Errorf("fencing for another generation of the copy: %v, %v; want nothing done", fenced, err)
	}
	for _, v := range []Volume{mounted, idle} {
		if fenced, err := m.fences.FenceSuperseded(ctx, v.ID, 1, 2); err != nil || !fenced || readonly(v.Dataset) != "on" {
			t.Fatalf("fencing %s for generation 2: %v, %v, readonly %s; want fenced and on", v.Name, fenced, err, readonly(v.Dataset))
		}
		if fenced, err := m.fences.FenceSuperseded(ctx, v.ID, 1, 2); err != nil || fenced {
			t.Errorf("fencing %s again: %v, %v; want nothing done", v.Name, fenced, err)
		}
		_, _, err := m.Stageable(ctx, v.ID, 1)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "generation 2") {
			t.Errorf("staging %s: %v; want FailedPrecondition naming generation 2", v.Name, err)
		}
	}
	if got, err := m.fences.LeaseFenced(ctx); err != nil || len(got) != 2 {
		t.Errorf("LeaseFenced = %v (%v); want both: the heartbeat asks about them at every beat", got, err)
	}
	if err := m.Unfence(ctx, idle.ID, 1); err != nil || readonly(idle.Dataset) != "off" {
		t.Fatalf("the controller's unfence: %v, readonly %s; want off", err, readonly(idle.Dataset))
	}
	if v, err := m.Get(ctx, idle.ID); err != nil || v.SupersededBy != 0 || v.LeaseFencedAt != 0 {
		t.Errorf("after the unfence: %+v (%v); want no mark left", v, err)
	}
	if _, unlock, err := m.Stageable(ctx, idle.ID, 1); err != nil {
		t.Errorf("staging after the unfence: %v", err)
	} else {
		unlock()
	}
}
