package volume

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Generations are reserved before they are used (docs/safety.md,
// "Generations"). Each node keeps, per volume, the highest generation it
// has promised and the node it promised it to, as a user property in the
// pool, with the copies: a node keeps it whether or not it holds a copy,
// and a restarted process reads it again. A promotion needs the promise
// of a majority of the nodes; two majorities share a node, and a node
// promises a generation to one holder only, so no generation is ever
// given to two copies (I3).
//
// Where the records live: never on the root dataset, whose
// user properties every volume below it inherits, so that every open of
// any volume read all of them (with 3000 records on the root, reading one
// property of a volume took 4.3 s instead of 0.23 s in the guest, and
// listing 20 volumes 50 s instead of 0.9 s). They are spread over
// copyrecord.PromiseShards small datasets beside the volumes,
// <root>/zn-promises/<shard>, from which no volume descends: a read or a
// write opens one of them, holding a 64th of the records, and a deleted
// volume's record is removed (zfs inherit), so they do not pile up.
//
// The record has its own lock (promiseLocks), apart from the copy's: a
// move reserves its generation on every node while the copy's final
// snapshot is being sent and received under the copy's lock, and waiting
// for that put a pool sync on the move's critical path. Reserve takes
// only the promise lock; Create, Promote and Forget take the copy's lock
// and then the promise lock, never the other way round.

// Promised returns what this node promised of volume id.
func (m *Manager) Promised(ctx context.Context, id string) (copyrecord.Promise, error) {
	if !contract.IsVolumeID(id) {
		return copyrecord.Promise{}, nil
	}
	p, _, err := m.readPromise(ctx, id)
	return p, err
}

// readPromise reads the record of volume id; onRoot tells that it was
// found on the root dataset, where older builds kept them
// (legacyPromises).
func (m *Manager) readPromise(ctx context.Context, id string) (p copyrecord.Promise, onRoot bool, err error) {
	v, ok, err := m.zfs.UserProperty(ctx, copyrecord.PromiseShard(m.cfg.RootDataset, id), copyrecord.PromiseProperty(id))
	if errors.Is(err, zfs.ErrNotFound) { // no record in this shard yet
		v, ok, err = "", false, nil
	}
	if err == nil && !ok && m.legacyPromises.Load() {
		v, ok, err = m.zfs.UserProperty(ctx, m.cfg.RootDataset, copyrecord.PromiseProperty(id))
		onRoot = ok
	}
	if err != nil {
		return copyrecord.Promise{}, false, zfsError(err, "reading the generation promised for volume "+id)
	}
	if !ok {
		return copyrecord.Promise{}, false, nil
	}
	return copyrecord.ParsePromise(v), onRoot, nil
}

// writePromise records p for volume id in its shard, making the shard
// (and the dataset of the shards) on first use.
func (m *Manager) writePromise(ctx context.Context, id string, p copyrecord.Promise) error {
	shard := copyrecord.PromiseShard(m.cfg.RootDataset, id)
	record := map[string]string{copyrecord.PromiseProperty(id): p.String()}
	err := m.zfs.SetProperties(ctx, shard, record)
	if !errors.Is(err, zfs.ErrNotFound) {
		return err
	}
	if err := m.makeRecordDatasets(ctx, zfs.Parent(shard), shard); err != nil {
		return err
	}
	return m.zfs.SetProperties(ctx, shard, record)
}

// makeRecordDatasets makes the datasets that hold records (each after its
// parent), those that exist already aside: never mounted, holding no
// data, only properties.
func (m *Manager) makeRecordDatasets(ctx context.Context, names ...string) error {
	for _, ds := range names {
		err := m.zfs.CreateFilesystem(ctx, ds, map[string]string{"canmount": "off", "mountpoint": "none"})
		if err != nil && !errors.Is(err, zfs.ErrExists) {
			return err
		}
	}
	return nil
}

// clearPromise removes the record of volume id, if there is one: a
// removal costs a pool sync. While records may be kept on the root, the
// root's goes too.
func (m *Manager) clearPromise(ctx context.Context, id string) error {
	p, onRoot, err := m.readPromise(ctx, id)
	switch {
	case err != nil:
		return err
	case onRoot: // the shard holds none
		return m.zfs.ClearUserProperty(ctx, m.cfg.RootDataset, copyrecord.PromiseProperty(id))
	case p.Generation == 0:
		return nil
	}
	if err := m.zfs.ClearUserProperty(ctx, copyrecord.PromiseShard(m.cfg.RootDataset, id), copyrecord.PromiseProperty(id)); err != nil {
		return err
	}
	if m.legacyPromises.Load() { // a reservation that failed to clear it
		return m.zfs.ClearUserProperty(ctx, m.cfg.RootDataset, copyrecord.PromiseProperty(id))
	}
	return nil
}

// CheckLegacyPromises looks once, at the node's start, for promise
// records kept on the root dataset by older builds. While
// some are, a record not found in its shard is looked for on the root too
// (a read of the root costs in proportion to them), a reservation moves
// the record it supersedes off the root, and a deletion removes it.
// When none is left, or none was, reads never open the root again.
func (m *Manager) CheckLegacyPromises(ctx context.Context) error {
	legacy, err := m.zfs.OwnUserProperties(ctx, m.cfg.RootDataset, copyrecord.PropPromisePrefix)
	if err != nil {
		return zfsError(err, "looking for promise records on the root dataset")
	}
	var forgotten []string // "0": what earlier builds left of a deleted volume's
	for key, v := range legacy {
		if copyrecord.ParsePromise(v).Generation == 0 {
			forgotten = append(forgotten, key)
		}
	}
	live := len(legacy) - len(forgotten)
	m.legacyPromises.Store(len(legacy) > 0)
	if live > 0 {
		m.log.Warn("promise records are kept on the root dataset by an earlier build: every volume inherits them, which slows every read; each moves to its shard at the volume's next reservation, and goes with its deletion",
			"records", live, "root", m.cfg.RootDataset)
	}
	if len(forgotten) > 0 {
		go m.dropForgotten(forgotten, live == 0)
	}
	return nil
}

// dropForgotten removes, in the background, the records of deleted
// volumes that earlier builds left on the root as "0" (they promise
// nothing); when no other record is kept there, reads then stop looking.
func (m *Manager) dropForgotten(keys []string, last bool) {
	ctx := context.Background()
	for _, key := range keys {
		if err := m.zfs.ClearUserProperty(ctx, m.cfg.RootDataset, key); err != nil {
			m.log.Warn("removing a deleted volume's promise record from the root dataset failed; the next start retries", "record", key, "error", err)
			return
		}
	}
	m.log.Info("removed the promise records of deleted volumes from the root dataset", "records", len(keys))
	if last {
		m.legacyPromises.Store(false)
	}
}

// lockedPromise reads the promise of volume id under its lock.
func (m *Manager) lockedPromise(ctx context.Context, id string) (copyrecord.Promise, error) {
	unlock, err := m.promiseLocks.Lock(ctx, id)
	if err != nil {
		return copyrecord.Promise{}, fmt.Errorf("%w: waiting for the promise record of volume %s: %v", errdefs.ErrAborted, id, err)
	}
	defer unlock()
	return m.Promised(ctx, id)
}

// Reserve promises generation of volume id to holder. It is granted above
// every generation this node promised or holds a copy of, and again to the
// same holder (a retried reservation); otherwise refused, returning what
// stands in the way. granted reports which.
//
// A promise to the volume's deletion (contract.DeletionHolder) stands until
// the delete has it forgotten: every other reservation is refused, so no
// copy is promoted or created while the delete removes the copies; a
// deletion's own is granted again at its generation or below (a retried
// or a concurrent delete of the same volume).
func (m *Manager) Reserve(ctx context.Context, id string, generation uint64, holder string) (copyrecord.Promise, bool, error) {
	return m.reserve(ctx, id, generation, holder, false)
}

// ReserveForFailover is Reserve for a failover's generation, which is
// refused outright while this node holds a primary of the volume: a
// failover promotes a replica because no answering node holds the
// primary, and a node that holds one is its proof that the look was torn
// (it read the node before a move promoted it). The check and the
// promise share the promise's lock with Promote, so no promotion of this
// node's copy slips between them.
func (m *Manager) ReserveForFailover(ctx context.Context, id string, generation uint64, holder string) (copyrecord.Promise, bool, error) {
	return m.reserve(ctx, id, generation, holder, true)
}

func (m *Manager) reserve(ctx context.Context, id string, generation uint64, holder string, failover bool) (copyrecord.Promise, bool, error) {
	if !contract.IsVolumeID(id) {
		return copyrecord.Promise{}, false, fmt.Errorf("%w: %q is not a volume ID", errdefs.ErrInvalidArgument, id)
	}
	if generation == 0 || holder == "" {
		return copyrecord.Promise{}, false, fmt.Errorf("%w: reserving a generation of volume %s needs a generation and a holder", errdefs.ErrInvalidArgument, id)
	}
	// Only the promise's lock: the copy may be receiving a move's final
	// snapshot meanwhile. Its generation, read below without the copy's
	// lock, is the one before or after that receive, both below any
	// generation a controller reserves for the move (nextGeneration).
	unlock, err := m.promiseLocks.Lock(ctx, id)
	if err != nil {
		return copyrecord.Promise{}, false, fmt.Errorf("%w: waiting for the promise record of volume %s: %v", errdefs.ErrAborted, id, err)
	}
	defer unlock()
	promised, onRoot, err := m.readPromise(ctx, id)
	if err != nil {
		return copyrecord.Promise{}, false, err
	}
	if promised.Generation == generation && promised.Holder == holder {
		return promised, true, nil
	}
	if promised.Holder == contract.DeletionHolder {
		granted := holder == contract.DeletionHolder && generation <= promised.Generation
		return promised, granted, nil
	}
	held, role, err := m.copyGenerationAndRole(ctx, id)
	if err != nil {
		return copyrecord.Promise{}, false, err
	}
	if failover && role == contract.RolePrimary {
		return copyrecord.Promise{}, false, fmt.Errorf("%w: node %s holds the primary of volume %s (generation %d): no failover is granted while it does; look again",
			errdefs.ErrFailedPrecondition, m.cfg.NodeID, id, held)
	}
	known := promised
	if held > known.Generation {
		known = copyrecord.Promise{Generation: held, Holder: m.cfg.NodeID}
	}
	if generation <= known.Generation {
		return known, false, nil
	}
	want := copyrecord.Promise{Generation: generation, Holder: holder}
	if err := m.writePromise(ctx, id, want); err != nil {
		return copyrecord.Promise{}, false, zfsError(err, "recording the generation promised for volume "+id)
	}
	if onRoot { // superseded by the shard's record
		if err := m.zfs.ClearUserProperty(ctx, m.cfg.RootDataset, copyrecord.PromiseProperty(id)); err != nil {
			m.log.Warn("removing the superseded promise record from the root dataset failed; its deletion retries", "volume_id", id, "error", err)
		}
	}
	m.log.Info("generation promised", "volume_id", id, "generation", generation, "holder", holder)
	return promised, true, nil
}

// copyGenerationAndRole is the generation and role of this node's copy
// of id (0 and "" when it holds none), read without listing the copy's
// snapshots as Copy does: reservations run on every node while the
// copies take and receive snapshots, and the listing only competed with
// them.
func (m *Manager) copyGenerationAndRole(ctx context.Context, id string) (uint64, string, error) {
	ds, exists, err := m.copyDataset(ctx, id)
	if err != nil || !exists {
		return 0, "", err
	}
	generation, _ := strconv.ParseUint(ds.User[copyrecord.PropGeneration], 10, 64)
	return generation, ds.User[copyrecord.PropRole], nil
}

// Forget drops the promise of a volume being deleted, so that a volume
// created later under the same name starts afresh.
func (m *Manager) Forget(ctx context.Context, id string) error {
	if !contract.IsVolumeID(id) {
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
	if err := m.clearPromise(ctx, id); err != nil {
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
	if !c.Exists || c.Role != contract.RolePrimary || c.Generation != generation {
		return fmt.Errorf("%w: node %s holds no primary of volume %s at generation %d to mark as forced", errdefs.ErrFailedPrecondition, m.cfg.NodeID, id, generation)
	}
	if err := m.zfs.SetProperties(ctx, datasetFor(m.cfg.RootDataset, id), map[string]string{copyrecord.PropForced: strconv.FormatUint(generation, 10)}); err != nil {
		return zfsError(err, "marking volume "+id+" as forced")
	}
	m.mayHoldForced.Store(true)
	m.log.Warn("primary promoted by the operator without a majority of the nodes", "volume_id", id, "generation", generation)
	return nil
}

// checkPromised refuses a promotion to a generation this node has not been
// promised: the controller reserves it on a majority first. The caller
// holds the promise's lock (Promote).
func (m *Manager) checkPromised(ctx context.Context, id string, generation uint64) error {
	promised, err := m.Promised(ctx, id)
	if err != nil {
		return err
	}
	if promised.Generation != generation || promised.Holder != m.cfg.NodeID {
		return fmt.Errorf("%w: generation %d of volume %s is not reserved for node %s (this node promised generation %d to %q); the controller reserves it on a majority of the nodes first",
			errdefs.ErrFailedPrecondition, generation, id, m.cfg.NodeID, promised.Generation, promised.Holder)
	}
	return nil
}

// checkNotPromisedAway refuses to make v writable again (Unfence) while
// this node's own record promises a generation above v's to another node:
// that node may be promoted with it at any moment (a move's final step in
// flight), and v would then be a second primary. The promise stops
// standing in the way only when superseded: the controller reserves a
// newer generation for this node's copy, which the holder must grant too,
// after which the holder can never be promoted with the old one
// (docs/safety.md, "A publish to the source while a move runs").
func (m *Manager) checkNotPromisedAway(ctx context.Context, v Volume) error {
	promised, err := m.lockedPromise(ctx, v.ID)
	if err != nil {
		return err
	}
	if promised.Generation <= v.Generation || promised.Holder == m.cfg.NodeID {
		return nil
	}
	return fmt.Errorf("%w: node %s promised generation %d of volume %s to node %s, above this copy's generation %d: node %s may be promoted with it, "+
		"so this copy stays read-only; a publish here first reserves a newer generation for node %s (node %s must grant it), then lifts the fence",
		errdefs.ErrFailedPrecondition, m.cfg.NodeID, promised.Generation, v.ID, promised.Holder, v.Generation, promised.Holder, m.cfg.NodeID, promised.Holder)
}

// checkPromisedTo refuses to fence v for a move to target unless this
// node's own record promises target a generation above v's: a move
// reserves the target's generation on a majority, this node included,
// before it fences. So from the fence on, checkNotPromisedAway keeps the
// fence up until a newer reservation supersedes the move's, whichever
// controller instance asks, and a fence never goes up for a promotion that
// no majority, the source's node among it, has promised.
func (m *Manager) checkPromisedTo(ctx context.Context, v Volume, target string) error {
	promised, err := m.lockedPromise(ctx, v.ID)
	if err != nil {
		return err
	}
	if promised.Generation > v.Generation && promised.Holder == target {
		return nil
	}
	return fmt.Errorf("%w: node %s has not promised node %s a generation of volume %s above this copy's %d (its record: generation %d to %q): "+
		"a move reserves the target's generation on a majority of the nodes, this one included, before it fences the source; retry the publish",
		errdefs.ErrFailedPrecondition, m.cfg.NodeID, target, v.ID, v.Generation, promised.Generation, promised.Holder)
}
