package volume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"golang.org/x/sync/errgroup"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// A node that lost its lease (package lease) makes its mounted primaries
// read-only: while it hears from no majority of its peers, another copy
// may be promoted, and two writers must never be (docs/safety.md,
// "Leases"). The mark lives on the dataset, so a restart keeps it.

// Fences are the lease's hold on this node's primaries (package lease
// calls them; it is lease.Volumes): a node that lost its lease makes its
// mounted primaries read-only (SelfFence) and lifts that only once a
// majority of the domain confirmed no newer copy exists; a primary a
// newer generation was promised for elsewhere is made read-only
// (FenceSuperseded); after a start or a lost lease a primary is staged
// only once confirmed (confirm.go); a copy the operator forced without a
// majority is exempt until a majority answers again (MarkForced,
// EndForced). The Manager asks Fences before it stages or unfences a
// primary, and confirms the generations it makes.
type Fences struct {
	copies  primaryCopies
	records *Records
	index   *Index
	zfs     zfs.Writer
	nodeID  string
	log     hclog.Logger
	// held reports whether this node holds its lease; nil until the
	// lease starts (FollowLease), and on a node without one.
	held      func() bool
	confirmed confirmations
	// mayHoldForced tells that a copy the operator forced may be on the
	// pool (at start, and after MarkForced): EndForced lists the pool
	// only then, not at every beat.
	mayHoldForced atomic.Bool
}

// primaryCopies are the node's primaries as Fences reads and changes
// them: under each copy's lock (the Manager).
type primaryCopies interface {
	// List lists the pool.
	List(ctx context.Context) ([]Volume, error)
	get(ctx context.Context, id string) (Volume, error)
	lock(ctx context.Context, id, what string) (func(), error)
	mounted(dataset string) (bool, error)
	// now is the node's wall clock, which dates fences.
	now() time.Time
}

func newFences(copies primaryCopies, records *Records, index *Index, z zfs.Writer, nodeID string, log hclog.Logger) *Fences {
	f := &Fences{copies: copies, records: records, index: index, zfs: z, nodeID: nodeID, log: log}
	f.mayHoldForced.Store(true)
	return f
}

// FollowLease makes the fences follow the node's lease, held reporting
// whether it is held. The lease starts after the node's parts are built
// (its monitor counts from then), so it comes after construction.
func (f *Fences) FollowLease(held func() bool) { f.held = held }

// Held reports whether the node holds its lease; false before it starts.
func (f *Fences) Held() bool { return f.held != nil && f.held() }

// leaseLost reports whether the node follows a lease it does not hold.
func (f *Fences) leaseLost() bool { return f.held != nil && !f.held() }

// Promised is the highest generation of volume id this node promised
// (lease.Volumes: the heartbeat asks its peers about higher ones).
func (f *Fences) Promised(ctx context.Context, id string) (uint64, error) {
	p, err := f.records.Promised(ctx, id)
	return p.Generation, err
}

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
// may wait up to copylock.DefaultWait for its lock, and the lease margin allows
// for one such wait (config.FenceAllowance), not one per volume.
func (f *Fences) SelfFence(ctx context.Context) ([]string, error) {
	vols, err := f.copies.List(ctx)
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
			ok, err := f.selfFence(ctx, v.ID)
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

func (f *Fences) selfFence(ctx context.Context, id string) (bool, error) {
	unlock, err := f.copies.lock(ctx, id, "self-fence after losing the lease")
	if err != nil {
		return false, err
	}
	defer unlock()
	v, err := f.copies.get(ctx, id)
	if err != nil {
		return false, err
	}
	if v.LeaseFencedAt != 0 || v.MovingTo != "" || v.Forced {
		return false, nil
	}
	mounted, err := f.copies.mounted(v.Dataset)
	if err != nil || !mounted {
		return false, err
	}
	props := map[string]string{"readonly": "on", copyrecord.PropLeaseFenced: strconv.FormatInt(f.copies.now().UnixNano(), 10)}
	if err := f.zfs.SetProperties(ctx, v.Dataset, props); err != nil {
		return false, zfsError(err, "making volume "+id+" read-only after losing the lease")
	}
	f.log.Warn("lease lost: volume made read-only; writes fail until a majority of the nodes confirms no newer copy exists",
		"volume_id", id, "generation", v.Generation)
	return true, nil
}

// supersededBy reads PropSuperseded: the newer generation promised
// elsewhere, or 0.
func supersededBy(v string) uint64 {
	g, _ := strconv.ParseUint(v, 10, 64)
	return g
}

// FenceSuperseded makes this node's primary of volume id read-only because
// it learned that generation newer, above the copy's generation, was
// promised elsewhere (the heartbeat's Promises round, this node's own
// record): another copy may be the primary now, and this one must take
// no write, whatever is mounted (docs/safety.md, I4). It is the lease's
// fence, readonly=on with PropLeaseFenced, and PropSuperseded saying why:
// the marks live on the dataset, so a restart keeps them, and nothing
// that does not know about a newer promise lifts them. The heartbeat lifts
// a lease fence only once a majority of the domain confirms that no
// generation above the copy's was promised, which cannot happen while the
// promise stands; the controller's Unfence lifts it only when a publish
// finds this copy the newest (the promise was never used: an abandoned
// move or failover), as it does any lease fence. Stageable refuses the
// copy meanwhile, naming the newer generation. A copy fenced for a move is
// read-only already and left as it is; so is one of another generation
// (it changed meanwhile). It reports whether it fenced the copy now.
func (f *Fences) FenceSuperseded(ctx context.Context, id string, generation, newer uint64) (bool, error) {
	// The heartbeat asks again at every beat while the copy stays
	// unconfirmed: one fenced already is seen without waiting for the
	// copy's lock, which a receive or a push may hold.
	if v, err := f.copies.get(ctx, id); err == nil && v.SupersededBy >= newer {
		return false, nil
	}
	unlock, err := f.copies.lock(ctx, id, "fencing a copy superseded elsewhere")
	if err != nil {
		return false, err
	}
	defer unlock()
	v, err := f.copies.get(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrFailedPrecondition) {
		return false, nil // gone or no primary any more
	}
	if err != nil {
		return false, err
	}
	if v.Generation != generation || newer <= generation || v.MovingTo != "" || v.SupersededBy >= newer {
		return false, nil
	}
	f.forgetConfirmation(id)
	props := map[string]string{"readonly": "on", copyrecord.PropSuperseded: strconv.FormatUint(newer, 10)}
	if v.LeaseFencedAt == 0 {
		props[copyrecord.PropLeaseFenced] = strconv.FormatInt(f.copies.now().UnixNano(), 10)
	}
	if err := f.zfs.SetProperties(ctx, v.Dataset, props); err != nil {
		return false, zfsError(err, "making volume "+id+" read-only: a newer generation was promised elsewhere")
	}
	mounted, _ := f.copies.mounted(v.Dataset)
	f.log.Warn("a newer generation of the volume was promised elsewhere: this copy is made read-only and is not staged; the controller publishes the newest copy",
		"volume_id", id, "generation", generation, "promised", newer, "mounted", mounted)
	return true, nil
}

// LeaseFenced returns the primaries fenced by the lease, with their
// generations.
func (f *Fences) LeaseFenced(ctx context.Context) (map[string]uint64, error) {
	vols, err := f.copies.List(ctx)
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
func (f *Fences) LiftLeaseFence(ctx context.Context, id string, generation uint64) error {
	unlock, err := f.copies.lock(ctx, id, "lifting the lease fence")
	if err != nil {
		return err
	}
	defer unlock()
	v, err := f.copies.get(ctx, id)
	if err != nil {
		return err
	}
	return f.liftLeaseFence(ctx, v, generation)
}

// liftLeaseFence makes v writable again if it is fenced by the lease, of
// generation, and the node holds its lease again. The caller holds the
// volume's lock.
func (f *Fences) liftLeaseFence(ctx context.Context, v Volume, generation uint64) error {
	id := v.ID
	if v.LeaseFencedAt == 0 {
		return nil
	}
	if f.leaseLost() {
		return fmt.Errorf("%w: node %s hears from no majority of its peers (every domain): volume %s stays read-only until it does", errdefs.ErrUnavailable, f.nodeID, id)
	}
	if v.Generation != generation || v.MovingTo != "" {
		return fmt.Errorf("%w: volume %s is at generation %d (moving to %q); the confirmation was for generation %d",
			errdefs.ErrFailedPrecondition, id, v.Generation, v.MovingTo, generation)
	}
	if v.SupersededBy != 0 {
		f.log.Warn("lifting the fence of a copy a newer generation was promised elsewhere for: the controller found no newer copy (the promise was never used)",
			"volume_id", id, "generation", generation, "promised", v.SupersededBy)
	}
	if err := f.zfs.SetProperties(ctx, v.Dataset, map[string]string{"readonly": "off", copyrecord.PropLeaseFenced: "-", copyrecord.PropSuperseded: "-"}); err != nil {
		return zfsError(err, "making volume "+id+" writable again")
	}
	f.log.Info("lease held again and no newer copy exists: volume writable again", "volume_id", id, "generation", generation)
	f.Confirm(id, generation)
	return nil
}

// EndForced puts every primary the operator forced without a majority
// (promote -force) back under the lease's rules, and returns their IDs.
// The heartbeat calls it while this node holds its lease: a majority
// answers again, so the operator's word that the silent nodes are lost
// no longer stands in for theirs. From then on the copy self-fences when
// the lease is lost, is confirmed by a majority before it is staged
// again, and is made read-only when a newer generation was promised
// elsewhere, like any primary; the controller publishes it only with a
// majority answering. A copy forced at another generation than its
// current one carries no exemption already (Volume.Forced) and is left.
func (f *Fences) EndForced(ctx context.Context) ([]string, error) {
	// The heartbeat calls it every beat: the pool is listed only while a
	// forced copy may be on it, and a pass that fails looks again.
	if !f.mayHoldForced.Swap(false) {
		return nil, nil
	}
	vols, err := f.copies.List(ctx)
	if err != nil {
		f.mayHoldForced.Store(true)
		return nil, err
	}
	var (
		ended []string
		errs  []error
	)
	for _, v := range vols {
		if !v.Forced {
			continue
		}
		if err := f.endForced(ctx, v.ID); err != nil {
			f.mayHoldForced.Store(true)
			errs = append(errs, err)
			continue
		}
		ended = append(ended, v.ID)
	}
	return ended, errors.Join(errs...)
}

func (f *Fences) endForced(ctx context.Context, id string) error {
	unlock, err := f.copies.lock(ctx, id, "ending the operator's forced promotion")
	if err != nil {
		return err
	}
	defer unlock()
	v, err := f.copies.get(ctx, id)
	if err != nil || !v.Forced {
		return err
	}
	if err := f.zfs.ClearUserProperty(ctx, v.Dataset, copyrecord.PropForced); err != nil {
		return zfsError(err, "ending the forced promotion of volume "+id)
	}
	f.log.Warn("a majority of the nodes answers again: the copy the operator promoted without one is under the lease again (it is made read-only if the lease is lost, and confirmed before it is staged again)",
		"volume_id", id, "generation", v.Generation)
	return nil
}

// MarkForced records on the primary of volume id that the operator
// promoted it at generation without a majority of the nodes: the
// controller may then publish it while the majority stays lost, on the
// operator's word that the silent nodes hold nothing newer.
func (f *Fences) MarkForced(ctx context.Context, id string, generation uint64) error {
	unlock, err := f.copies.lock(ctx, id, "marking forced")
	if err != nil {
		return err
	}
	defer unlock()
	v, err := f.copies.get(ctx, id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound), errors.Is(err, errdefs.ErrFailedPrecondition), err == nil && v.Generation != generation:
		return fmt.Errorf("%w: node %s holds no primary of volume %s at generation %d to mark as forced", errdefs.ErrFailedPrecondition, f.nodeID, id, generation)
	case err != nil:
		return err
	}
	if err := f.zfs.SetProperties(ctx, v.Dataset, map[string]string{copyrecord.PropForced: strconv.FormatUint(generation, 10)}); err != nil {
		return zfsError(err, "marking volume "+id+" as forced")
	}
	f.mayHoldForced.Store(true)
	f.log.Warn("primary promoted by the operator without a majority of the nodes", "volume_id", id, "generation", generation)
	return nil
}
