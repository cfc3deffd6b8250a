package volume

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/keylock"
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
// The record has its own lock (Records.promiseLocks), apart from the copy's: a
// move reserves its generation on every node while the copy's final
// snapshot is being sent and received under the copy's lock, and waiting
// for that put a pool sync on the move's critical path. Reserve takes
// only the promise lock; Create, Promote and Forget take the copy's lock
// and then the promise lock, never the other way round.

// Records are this node's records, kept as user properties of datasets
// beside its volumes, in copyrecord's formats: per volume, the highest
// generation the node promised and to whom (this file), and the CSI
// snapshots deleted while a copy was out of reach (deleted.go). They are
// the node's word to the controllers, kept whether or not it holds a
// copy, so they are apart from the copies (Manager); the Manager reads
// them under a copy's lock where a change of the copy must agree with
// them (create, promotion, fence, unfence, forget).
type Records struct {
	zfs    zfs.DatasetManager
	root   string // the operator's root dataset
	nodeID string
	log    hclog.Logger
	// promiseLocks serialise the reads and writes of each volume's
	// promise record. It is not the copy's lock: Reserve takes only this
	// one, so a reservation never waits for a receive or a push of the
	// copy; anything that needs both takes the copy's lock first.
	promiseLocks keylock.Locks
	// legacyPromises tells that promise records may be kept on the root
	// dataset (CheckLegacyPromises); true until the node has looked.
	legacyPromises atomic.Bool
	// deleted: the records of snapshots deleted while a node was away.
	deleted deletedRecords
}

// NewRecords returns the records of the node cfg describes, on pool z.
func NewRecords(z zfs.DatasetManager, cfg config.Node, log hclog.Logger) *Records {
	r := &Records{zfs: z, root: cfg.RootDataset, nodeID: cfg.NodeID, log: log}
	r.legacyPromises.Store(true)
	return r
}

// lockPromise takes the lock of volume id's promise record.
func (r *Records) lockPromise(ctx context.Context, id string) (func(), error) {
	unlock, err := r.promiseLocks.Lock(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: waiting for the promise record of volume %s: %v", errdefs.ErrAborted, id, err)
	}
	return unlock, nil
}

// forget removes the promise record of volume id; the caller holds the
// copy's lock (Manager.Forget).
func (r *Records) forget(ctx context.Context, id string) error {
	unlock, err := r.lockPromise(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	if err := r.clearPromise(ctx, id); err != nil {
		return zfsError(err, "forgetting the generation promised for volume "+id)
	}
	return nil
}

// Promised returns what this node promised of volume id.
func (r *Records) Promised(ctx context.Context, id string) (copyrecord.Promise, error) {
	if !contract.IsVolumeID(id) {
		return copyrecord.Promise{}, nil
	}
	p, _, err := r.readPromise(ctx, id)
	return p, err
}

// readPromise reads the record of volume id; onRoot tells that it was
// found on the root dataset, where older builds kept them
// (legacyPromises).
func (r *Records) readPromise(ctx context.Context, id string) (p copyrecord.Promise, onRoot bool, err error) {
	v, ok, err := r.zfs.UserProperty(ctx, copyrecord.PromiseShard(r.root, id), copyrecord.PromiseProperty(id))
	if errors.Is(err, zfs.ErrNotFound) { // no record in this shard yet
		v, ok, err = "", false, nil
	}
	if err == nil && !ok && r.legacyPromises.Load() {
		v, ok, err = r.zfs.UserProperty(ctx, r.root, copyrecord.PromiseProperty(id))
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
func (r *Records) writePromise(ctx context.Context, id string, p copyrecord.Promise) error {
	shard := copyrecord.PromiseShard(r.root, id)
	record := map[string]string{copyrecord.PromiseProperty(id): p.String()}
	err := r.zfs.SetProperties(ctx, shard, record)
	if !errors.Is(err, zfs.ErrNotFound) {
		return err
	}
	if err := r.makeRecordDatasets(ctx, zfs.Parent(shard), shard); err != nil {
		return err
	}
	return r.zfs.SetProperties(ctx, shard, record)
}

// makeRecordDatasets makes the datasets that hold records (each after its
// parent), those that exist already aside: never mounted, holding no
// data, only properties.
func (r *Records) makeRecordDatasets(ctx context.Context, names ...string) error {
	for _, ds := range names {
		err := r.zfs.CreateFilesystem(ctx, ds, map[string]string{"canmount": "off", "mountpoint": "none"})
		if err != nil && !errors.Is(err, zfs.ErrExists) {
			return err
		}
	}
	return nil
}

// clearPromise removes the record of volume id, if there is one: a
// removal costs a pool sync. While records may be kept on the root, the
// root's goes too.
func (r *Records) clearPromise(ctx context.Context, id string) error {
	p, onRoot, err := r.readPromise(ctx, id)
	switch {
	case err != nil:
		return err
	case onRoot: // the shard holds none
		return r.zfs.ClearUserProperty(ctx, r.root, copyrecord.PromiseProperty(id))
	case p.Generation == 0:
		return nil
	}
	if err := r.zfs.ClearUserProperty(ctx, copyrecord.PromiseShard(r.root, id), copyrecord.PromiseProperty(id)); err != nil {
		return err
	}
	if r.legacyPromises.Load() { // a reservation that failed to clear it
		return r.zfs.ClearUserProperty(ctx, r.root, copyrecord.PromiseProperty(id))
	}
	return nil
}

// CheckLegacyPromises looks once, at the node's start, for promise
// records kept on the root dataset by older builds. While
// some are, a record not found in its shard is looked for on the root too
// (a read of the root costs in proportion to them), a reservation moves
// the record it supersedes off the root, and a deletion removes it.
// When none is left, or none was, reads never open the root again.
func (r *Records) CheckLegacyPromises(ctx context.Context) error {
	legacy, err := r.zfs.OwnUserProperties(ctx, r.root, copyrecord.PropPromisePrefix)
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
	r.legacyPromises.Store(len(legacy) > 0)
	if live > 0 {
		r.log.Warn("promise records are kept on the root dataset by an earlier build: every volume inherits them, which slows every read; each moves to its shard at the volume's next reservation, and goes with its deletion",
			"records", live, "root", r.root)
	}
	if len(forgotten) > 0 {
		go r.dropForgotten(forgotten, live == 0)
	}
	return nil
}

// dropForgotten removes, in the background, the records of deleted
// volumes that earlier builds left on the root as "0" (they promise
// nothing); when no other record is kept there, reads then stop looking.
func (r *Records) dropForgotten(keys []string, last bool) {
	ctx := context.Background()
	for _, key := range keys {
		if err := r.zfs.ClearUserProperty(ctx, r.root, key); err != nil {
			r.log.Warn("removing a deleted volume's promise record from the root dataset failed; the next start retries", "record", key, "error", err)
			return
		}
	}
	r.log.Info("removed the promise records of deleted volumes from the root dataset", "records", len(keys))
	if last {
		r.legacyPromises.Store(false)
	}
}

// lockedPromise reads the promise of volume id under its lock.
func (r *Records) lockedPromise(ctx context.Context, id string) (copyrecord.Promise, error) {
	unlock, err := r.lockPromise(ctx, id)
	if err != nil {
		return copyrecord.Promise{}, err
	}
	defer unlock()
	return r.Promised(ctx, id)
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
func (r *Records) Reserve(ctx context.Context, id string, generation uint64, holder string) (copyrecord.Promise, bool, error) {
	return r.reserve(ctx, id, generation, holder, false)
}

// ReserveForFailover is Reserve for a failover's generation, which is
// refused outright while this node holds a primary of the volume: a
// failover promotes a replica because no answering node holds the
// primary, and a node that holds one is its proof that the look was torn
// (it read the node before a move promoted it). The check and the
// promise share the promise's lock with Promote, so no promotion of this
// node's copy slips between them.
func (r *Records) ReserveForFailover(ctx context.Context, id string, generation uint64, holder string) (copyrecord.Promise, bool, error) {
	return r.reserve(ctx, id, generation, holder, true)
}

func (r *Records) reserve(ctx context.Context, id string, generation uint64, holder string, failover bool) (copyrecord.Promise, bool, error) {
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
	unlock, err := r.lockPromise(ctx, id)
	if err != nil {
		return copyrecord.Promise{}, false, err
	}
	defer unlock()
	promised, onRoot, err := r.readPromise(ctx, id)
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
	held, role, err := r.copyGenerationAndRole(ctx, id)
	if err != nil {
		return copyrecord.Promise{}, false, err
	}
	if failover && role == contract.RolePrimary {
		return copyrecord.Promise{}, false, fmt.Errorf("%w: node %s holds the primary of volume %s (generation %d): no failover is granted while it does; look again",
			errdefs.ErrFailedPrecondition, r.nodeID, id, held)
	}
	known := promised
	if held > known.Generation {
		known = copyrecord.Promise{Generation: held, Holder: r.nodeID}
	}
	if generation <= known.Generation {
		return known, false, nil
	}
	want := copyrecord.Promise{Generation: generation, Holder: holder}
	if err := r.writePromise(ctx, id, want); err != nil {
		return copyrecord.Promise{}, false, zfsError(err, "recording the generation promised for volume "+id)
	}
	if onRoot { // superseded by the shard's record
		if err := r.zfs.ClearUserProperty(ctx, r.root, copyrecord.PromiseProperty(id)); err != nil {
			r.log.Warn("removing the superseded promise record from the root dataset failed; its deletion retries", "volume_id", id, "error", err)
		}
	}
	r.log.Info("generation promised", "volume_id", id, "generation", generation, "holder", holder)
	return promised, true, nil
}

// copyGenerationAndRole is the generation and role of this node's copy
// of id (0 and "" when it holds none), read without listing the copy's
// snapshots as Copy does: reservations run on every node while the
// copies take and receive snapshots, and the listing only competed with
// them.
func (r *Records) copyGenerationAndRole(ctx context.Context, id string) (uint64, string, error) {
	ds, exists, err := readCopy(ctx, r.zfs, r.root, id)
	if err != nil || !exists {
		return 0, "", err
	}
	generation, _ := strconv.ParseUint(ds.User[copyrecord.PropGeneration], 10, 64)
	return generation, ds.User[copyrecord.PropRole], nil
}

// checkPromised refuses a promotion to a generation this node has not been
// promised: the controller reserves it on a majority first. The caller
// holds the promise's lock (Promote).
func (r *Records) checkPromised(ctx context.Context, id string, generation uint64) error {
	promised, err := r.Promised(ctx, id)
	if err != nil {
		return err
	}
	if promised.Generation != generation || promised.Holder != r.nodeID {
		return fmt.Errorf("%w: generation %d of volume %s is not reserved for node %s (this node promised generation %d to %q); the controller reserves it on a majority of the nodes first",
			errdefs.ErrFailedPrecondition, generation, id, r.nodeID, promised.Generation, promised.Holder)
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
func (r *Records) checkNotPromisedAway(ctx context.Context, v Volume) error {
	promised, err := r.lockedPromise(ctx, v.ID)
	if err != nil {
		return err
	}
	if promised.Generation <= v.Generation || promised.Holder == r.nodeID {
		return nil
	}
	return fmt.Errorf("%w: node %s promised generation %d of volume %s to node %s, above this copy's generation %d: node %s may be promoted with it, "+
		"so this copy stays read-only; a publish here first reserves a newer generation for node %s (node %s must grant it), then lifts the fence",
		errdefs.ErrFailedPrecondition, r.nodeID, promised.Generation, v.ID, promised.Holder, v.Generation, promised.Holder, r.nodeID, promised.Holder)
}

// checkPromisedTo refuses to fence v for a move to target unless this
// node's own record promises target a generation above v's: a move
// reserves the target's generation on a majority, this node included,
// before it fences. So from the fence on, checkNotPromisedAway keeps the
// fence up until a newer reservation supersedes the move's, whichever
// controller instance asks, and a fence never goes up for a promotion that
// no majority, the source's node among it, has promised.
func (r *Records) checkPromisedTo(ctx context.Context, v Volume, target string) error {
	promised, err := r.lockedPromise(ctx, v.ID)
	if err != nil {
		return err
	}
	if promised.Generation > v.Generation && promised.Holder == target {
		return nil
	}
	return fmt.Errorf("%w: node %s has not promised node %s a generation of volume %s above this copy's %d (its record: generation %d to %q): "+
		"a move reserves the target's generation on a majority of the nodes, this one included, before it fences the source; retry the publish",
		errdefs.ErrFailedPrecondition, r.nodeID, target, v.ID, v.Generation, promised.Generation, promised.Holder)
}
