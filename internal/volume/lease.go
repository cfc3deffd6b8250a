package volume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
)

// A node that lost its lease (package lease) makes its mounted primaries
// read-only: while it hears from no majority of its peers, another copy
// may be promoted, and two writers must never be (docs/safety.md,
// "Leases"). The mark lives on the dataset, so a restart keeps it.

// leaseFencedAt reads PropLeaseFenced: unix nanos, or 0 when not fenced.
func leaseFencedAt(v string) int64 {
	at, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0
	}
	return at
}

// SelfFence makes every mounted primary of this node read-only (writes
// fail with EROFS) and marks it as fenced by the lease. It returns the IDs
// it fenced now; ones fenced already, moving or not mounted are left, and
// so is a copy the operator forced without a majority (promote -force):
// the operator took on what the lease guards against. It lists the pool
// rather than trusting the primary index: it is the guard against two
// writers, and runs only while the lease is lost.
//
// It fences the volumes all at once (selfFenceParallel at a time): each
// may wait up to copylock.Wait for its lock, and the lease margin allows
// for one such wait (config.FenceAllowance), not one per volume.
func (m *Manager) SelfFence(ctx context.Context) ([]string, error) {
	vols, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	var (
		mu     sync.Mutex
		fenced []string
		errs   []error
		g      errgroup.Group
	)
	g.SetLimit(selfFenceParallel)
	for _, v := range vols {
		if v.LeaseFencedAt != 0 || v.MovingTo != "" || v.Forced {
			continue
		}
		g.Go(func() error {
			ok, err := m.selfFence(ctx, v.ID)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if ok {
				fenced = append(fenced, v.ID)
			}
			return nil // every volume is tried, whatever the others do
		})
	}
	_ = g.Wait()
	slices.Sort(fenced)
	return fenced, errors.Join(errs...)
}

// selfFenceParallel bounds the volumes SelfFence fences at once. Most of
// the time is waiting for a busy lock or for the remount, not work; a
// node with more mounted primaries than this whose locks are all busy at
// once needs one FenceAllowance per round of them (docs/safety.md).
const selfFenceParallel = 64

func (m *Manager) selfFence(ctx context.Context, id string) (bool, error) {
	unlock, err := m.lock(ctx, id, "self-fence after losing the lease")
	if err != nil {
		return false, err
	}
	defer unlock()
	v, err := m.get(ctx, id)
	if err != nil {
		return false, err
	}
	if v.LeaseFencedAt != 0 || v.MovingTo != "" || v.Forced {
		return false, nil
	}
	mounted, err := m.mounted(v.Dataset)
	if err != nil || !mounted {
		return false, err
	}
	props := map[string]string{"readonly": "on", PropLeaseFenced: strconv.FormatInt(m.now().UnixNano(), 10)}
	if err := m.zfs.SetProperties(ctx, v.Dataset, props); err != nil {
		return false, zfsError(err, "making volume "+id+" read-only after losing the lease")
	}
	m.log.Warn("lease lost: volume made read-only; writes fail until a majority of the nodes confirms no newer copy exists",
		"volume_id", id, "generation", v.Generation)
	return true, nil
}

// LeaseFenced returns the primaries fenced by the lease, with their
// generations.
func (m *Manager) LeaseFenced(ctx context.Context) (map[string]uint64, error) {
	vols, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, v := range vols {
		if v.LeaseFencedAt != 0 {
			out[v.ID] = v.Generation
		}
	}
	return out, nil
}

// LiftLeaseFence makes the primary writable again once a majority of the
// domain confirmed that none of them promised a generation above
// generation: no other copy can have been promoted. It does nothing to a
// copy of another generation or one fenced for a move.
func (m *Manager) LiftLeaseFence(ctx context.Context, id string, generation uint64) error {
	unlock, err := m.lock(ctx, id, "lifting the lease fence")
	if err != nil {
		return err
	}
	defer unlock()
	v, err := m.get(ctx, id)
	if err != nil {
		return err
	}
	return m.liftLeaseFence(ctx, v, generation)
}

// liftLeaseFence makes v writable again if it is fenced by the lease, of
// generation, and the node holds its lease again. The caller holds the
// volume's lock.
func (m *Manager) liftLeaseFence(ctx context.Context, v Volume, generation uint64) error {
	id := v.ID
	if v.LeaseFencedAt == 0 {
		return nil
	}
	if m.LeaseHeld != nil && !m.LeaseHeld() {
		return fmt.Errorf("%w: node %s hears from no majority of its peers (every domain): volume %s stays read-only until it does", errdefs.ErrUnavailable, m.cfg.NodeID, id)
	}
	if v.Generation != generation || v.MovingTo != "" {
		return fmt.Errorf("%w: volume %s is at generation %d (moving to %q); the confirmation was for generation %d",
			errdefs.ErrFailedPrecondition, id, v.Generation, v.MovingTo, generation)
	}
	if err := m.zfs.SetProperties(ctx, v.Dataset, map[string]string{"readonly": "off", PropLeaseFenced: "-"}); err != nil {
		return zfsError(err, "making volume "+id+" writable again")
	}
	m.log.Info("lease held again and no newer copy exists: volume writable again", "volume_id", id, "generation", generation)
	m.Confirm(id, generation)
	return nil
}
