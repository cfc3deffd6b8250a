package volume

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/vocab"
)

// Generations are reserved before they are used (docs/safety.md,
// "Generations"). Each node keeps, per volume, the highest generation it
// has promised and the node it promised it to, as a user property of the
// root dataset: the record lives in the pool, with the copies, and a node
// keeps it whether or not it holds a copy. A promotion needs the promise
// of a majority of the nodes; two majorities share a node, and a node
// promises a generation to one holder only, so no generation is ever
// given to two copies (I3).
//
// The record has its own lock (promiseLocks), apart from the copy's: a
// move reserves its generation on every node while the copy's final
// snapshot is being sent and received under the copy's lock, and waiting
// for that put a pool sync on the move's critical path. Reserve takes
// only the promise lock; Create, Promote and Forget take the copy's lock
// and then the promise lock, never the other way round.

// PropPromisePrefix + volume ID, on the root dataset: "GENERATION HOLDER".
const PropPromisePrefix = propPrefix + "promise:"

// Promise is what a node promised of one volume's generations.
type Promise struct {
	Generation uint64 // 0: nothing promised
	Holder     string // the node whose copy gets the generation
}

func promiseProp(id string) string { return PropPromisePrefix + id }

func parsePromise(v string) Promise {
	gen, holder, _ := strings.Cut(v, " ")
	n, err := strconv.ParseUint(gen, 10, 64)
	if err != nil {
		return Promise{}
	}
	return Promise{Generation: n, Holder: holder}
}

func (p Promise) String() string { return strconv.FormatUint(p.Generation, 10) + " " + p.Holder }

// Promised returns what this node promised of volume id.
func (m *Manager) Promised(ctx context.Context, id string) (Promise, error) {
	if !vocab.IsVolumeID(id) {
		return Promise{}, nil
	}
	v, ok, err := m.zfs.UserProperty(ctx, m.cfg.RootDataset, promiseProp(id))
	if err != nil {
		return Promise{}, zfsError(err, "reading the generation promised for volume "+id)
	}
	if !ok {
		return Promise{}, nil
	}
	return parsePromise(v), nil
}

// lockedPromise reads the promise of volume id under its lock.
func (m *Manager) lockedPromise(ctx context.Context, id string) (Promise, error) {
	unlock, err := m.promiseLocks.Lock(ctx, id)
	if err != nil {
		return Promise{}, fmt.Errorf("%w: waiting for the promise record of volume %s: %v", errdefs.ErrAborted, id, err)
	}
	defer unlock()
	return m.Promised(ctx, id)
}

// Reserve promises generation of volume id to holder. It is granted above
// every generation this node promised or holds a copy of, and again to the
// same holder (a retried reservation); otherwise refused, returning what
// stands in the way. granted reports which.
func (m *Manager) Reserve(ctx context.Context, id string, generation uint64, holder string) (Promise, bool, error) {
	if !vocab.IsVolumeID(id) {
		return Promise{}, false, fmt.Errorf("%w: %q is not a volume ID", errdefs.ErrInvalidArgument, id)
	}
	if generation == 0 || holder == "" {
		return Promise{}, false, fmt.Errorf("%w: reserving a generation of volume %s needs a generation and a holder", errdefs.ErrInvalidArgument, id)
	}
	// Only the promise's lock: the copy may be receiving a move's final
	// snapshot meanwhile. Its generation, read below without the copy's
	// lock, is the one before or after that receive, both below any
	// generation a controller reserves for the move (nextGeneration).
	unlock, err := m.promiseLocks.Lock(ctx, id)
	if err != nil {
		return Promise{}, false, fmt.Errorf("%w: waiting for the promise record of volume %s: %v", errdefs.ErrAborted, id, err)
	}
	defer unlock()
	promised, err := m.Promised(ctx, id)
	if err != nil {
		return Promise{}, false, err
	}
	if promised.Generation == generation && promised.Holder == holder {
		return promised, true, nil
	}
	held, err := m.copyGeneration(ctx, id)
	if err != nil {
		return Promise{}, false, err
	}
	known := promised
	if held > known.Generation {
		known = Promise{Generation: held, Holder: m.cfg.NodeID}
	}
	if generation <= known.Generation {
		return known, false, nil
	}
	want := Promise{Generation: generation, Holder: holder}
	if err := m.zfs.SetProperties(ctx, m.cfg.RootDataset, map[string]string{promiseProp(id): want.String()}); err != nil {
		return Promise{}, false, zfsError(err, "recording the generation promised for volume "+id)
	}
	m.log.Info("generation promised", "volume_id", id, "generation", generation, "holder", holder)
	return promised, true, nil
}

// copyGeneration is the generation of this node's copy of id (0 when it
// holds none), read without listing the copy's snapshots as Copy does: a
// move reserves its generation on every node while the source and the
// target take and receive its final snapshot, and the listing only
// competed with them.
func (m *Manager) copyGeneration(ctx context.Context, id string) (uint64, error) {
	ds, exists, err := m.copyDataset(ctx, id)
	if err != nil || !exists {
		return 0, err
	}
	generation, _ := strconv.ParseUint(ds.User[PropGeneration], 10, 64)
	return generation, nil
}

// Forget drops the promise of a volume being deleted, so that a volume
// created later under the same name starts afresh.
func (m *Manager) Forget(ctx context.Context, id string) error {
	if !vocab.IsVolumeID(id) {
		return nil
	}
	unlock, err := m.lock(ctx, id, "forgetting the promise")
	if err != nil {
		return err
	}
	defer unlock()
	unlockPromise, err := m.promiseLocks.Lock(ctx, id)
	if err != nil {
		return fmt.Errorf("%w: waiting for the promise record of volume %s: %v", errdefs.ErrAborted, id, err)
	}
	defer unlockPromise()
	promised, err := m.Promised(ctx, id)
	if err != nil || promised.Generation == 0 {
		return err
	}
	if err := m.zfs.SetProperties(ctx, m.cfg.RootDataset, map[string]string{promiseProp(id): "0"}); err != nil {
		return zfsError(err, "forgetting the generation promised for volume "+id)
	}
	return nil
}

// MarkForced records on the primary of volume id that the operator
// promoted it at generation without a majority of the nodes: the
// controller may then publish it while the majority stays lost, on the
// operator's word that the silent nodes hold nothing newer.
func (m *Manager) MarkForced(ctx context.Context, id string, generation uint64) error {
	unlock, err := m.lock(ctx, id, "marking forced")
	if err != nil {
		return err
	}
	defer unlock()
	c, err := m.Copy(ctx, id)
	if err != nil {
		return err
	}
	if !c.Exists || c.Role != vocab.RolePrimary || c.Generation != generation {
		return fmt.Errorf("%w: node %s holds no primary of volume %s at generation %d to mark as forced", errdefs.ErrFailedPrecondition, m.cfg.NodeID, id, generation)
	}
	if err := m.zfs.SetProperties(ctx, datasetFor(m.cfg.RootDataset, id), map[string]string{PropForced: strconv.FormatUint(generation, 10)}); err != nil {
		return zfsError(err, "marking volume "+id+" as forced")
	}
	m.log.Warn("primary promoted by the operator without a majority of the nodes", "volume_id", id, "generation", generation)
	return nil
}

// checkPromised refuses a promotion to a generation this node has not been
// promised: the controller reserves it on a majority first.
func (m *Manager) checkPromised(ctx context.Context, id string, generation uint64) error {
	promised, err := m.lockedPromise(ctx, id)
	if err != nil {
		return err
	}
	if promised.Generation != generation || promised.Holder != m.cfg.NodeID {
		return fmt.Errorf("%w: generation %d of volume %s is not reserved for node %s (this node promised generation %d to %q); the controller reserves it on a majority of the nodes first",
			errdefs.ErrFailedPrecondition, generation, id, m.cfg.NodeID, promised.Generation, promised.Holder)
	}
	return nil
}
