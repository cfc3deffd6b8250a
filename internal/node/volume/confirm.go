package volume

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Confirmed primaries (docs/safety.md, "Confirmed primaries"). A node
// whose process starts, or that lost its lease, cannot know whether
// another copy of one of its primaries was promoted meanwhile: a failover
// while it was powered off or cut off leaves its copy labelled primary at
// an older generation, and a replayed publish context of that generation
// (a restored allocation, Nomad keeping the original allocation of a
// reconnecting client) would pass the generation check. So, on a node
// with peers, a primary is staged only once a majority of the domain
// confirmed that none of them promised a newer generation since the
// process started or the lease was last lost. A mounted primary is not
// exempt: a zfs-node killed during a partition
// fenced nothing, the kernel kept the mount and the job kept writing, and
// when the process returns after a failover its mount proves nothing. The heartbeat asks about every unconfirmed primary,
// mounted ones included, and one a newer generation was promised for
// elsewhere is made read-only at once (FenceSuperseded).

// confirmations are the generations confirmed current, by volume ID, in
// memory: a restart forgets them, which is the point.
type confirmations struct {
	mu       sync.Mutex
	required bool
	gen      map[string]uint64
}

// RequireConfirmation makes staging wait for a primary's confirmation
// (nodes with peers; a node alone has no one to ask).
func (f *Fences) RequireConfirmation() {
	f.confirmed.mu.Lock()
	defer f.confirmed.mu.Unlock()
	f.confirmed.required = true
}

// Confirm records that a majority of the domain confirmed generation of
// volume id current (lease.Heartbeat), or that this node made it so
// (create, promotion).
func (f *Fences) Confirm(id string, generation uint64) {
	f.confirmed.mu.Lock()
	defer f.confirmed.mu.Unlock()
	if f.confirmed.gen == nil {
		f.confirmed.gen = map[string]uint64{}
	}
	f.confirmed.gen[id] = generation
}

// ForgetConfirmations forgets every confirmation: the node lost its lease,
// and a failover may follow.
func (f *Fences) ForgetConfirmations() {
	f.confirmed.mu.Lock()
	defer f.confirmed.mu.Unlock()
	f.confirmed.gen = nil
}

// forgetConfirmation forgets the confirmation of volume id.
func (f *Fences) forgetConfirmation(id string) {
	f.confirmed.mu.Lock()
	defer f.confirmed.mu.Unlock()
	delete(f.confirmed.gen, id)
}

func (f *Fences) isConfirmed(id string, generation uint64) bool {
	f.confirmed.mu.Lock()
	defer f.confirmed.mu.Unlock()
	return !f.confirmed.required || f.confirmed.gen[id] == generation
}

// Unconfirmed lists the primaries not confirmed at their generation, with
// it (forced copies are the operator's word and need none). It reads only
// the primaries without a confirmation: the heartbeat asks while one
// stays unconfirmed (a stale primary no majority vouches for may, for
// good), and reading all at every beat would cost in proportion to the
// node's volumes. A confirmation is always of the primary's current
// generation: every change of it (create, promote) confirms the new one,
// and losing the lease forgets them all.
func (f *Fences) Unconfirmed(ctx context.Context) (map[string]uint64, error) {
	primaries, err := f.index.primaries(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for id := range primaries {
		if f.hasConfirmation(id) {
			continue
		}
		v, err := f.copies.get(ctx, id)
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrFailedPrecondition) {
			continue // gone meanwhile
		}
		if err != nil {
			return nil, err
		}
		if !v.Forced && !f.isConfirmed(v.ID, v.Generation) {
			out[v.ID] = v.Generation
		}
	}
	return out, nil
}

// hasConfirmation reports whether a primary needs no asking: confirmation
// is not required, or it has one.
func (f *Fences) hasConfirmation(id string) bool {
	f.confirmed.mu.Lock()
	defer f.confirmed.mu.Unlock()
	_, ok := f.confirmed.gen[id]
	return !f.confirmed.required || ok
}

// checkConfirmed refuses to stage a primary no majority confirmed current
// since the process started or the lease was lost, mounted or not. A
// mount is no proof after a restart: the process may
// have been dead through a partition in which the volume was failed over,
// with the kernel keeping the mount and the job writing, and Nomad then
// replays the old publish context. What the mounted exemption was for, a
// running job whose stage or publish is run again while the lease was
// held throughout, needs none: this process staged that mount, so it
// confirmed that generation, and keeps the confirmation until the lease
// is lost (when the mount is fenced, and lifting the fence confirms it
// again). A re-run in the few seconds after a restart waits for the first
// beats (Unavailable; the CO retries).
func (f *Fences) checkConfirmed(v Volume) error {
	if v.Forced || f.isConfirmed(v.ID, v.Generation) {
		return nil
	}
	return fmt.Errorf("%w: node %s has not yet confirmed with a majority of its peers that its copy of volume %s (generation %d) is still the newest: "+
		"it started or lost its lease since, and another copy may have been promoted meanwhile (a mount from before is no proof); retry in a few seconds (a lease beat)",
		errdefs.ErrUnavailable, f.nodeID, v.ID, v.Generation)
}
