package volume

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/volumelog"
)

// The node's side of migration (docs/migration.md). The controller decides;
// these steps each check, under the volume's lock, that they are safe on
// this node's copy, and each is idempotent, so a move interrupted anywhere
// is finished or undone by repeating it.

// Copy is this node's copy of a volume, whatever its role.
type Copy struct {
	VolumeID   string
	Name       string
	Exists     bool
	Role       string // contract.RolePrimary or contract.RoleReplica
	Generation uint64
	MovingTo   string
	FencedAt   int64 // unix nanos
	Mounted    bool
	// LastSnapshot is the newest replication snapshot, LastSnapshotAt the
	// time in its name (unix nanos, the source's clock).
	LastSnapshot   string
	LastSnapshotAt int64
	Parameters     map[string]string
	Capacity       uint64
	// FailoverFrom is set on a primary promoted by failover: the newest
	// snapshot it had; writes after it on the lost primary may be gone.
	FailoverFrom string
	// Forced is the generation the operator promoted this primary at
	// without a majority of the nodes (MarkForced); 0 if never.
	Forced uint64
	// HistoryFrom is the oldest generation whose every snapshot is an
	// earlier state of this copy (copyrecord.HistoryFrom).
	HistoryFrom uint64
	// LeaseFenced: read-only since this node lost its lease.
	LeaseFenced bool
	// WrittenSince is, on an unmounted primary, the bytes written since
	// each of its replication snapshots (written@, by short name): what a
	// final increment from a replica holding that snapshot sends. A
	// snapshot ZFS did not answer for is left out. A mounted primary's
	// is not read (a read per snapshot): its workload may write any
	// amount before its final snapshot, so the controller judges it by
	// age alone.
	WrittenSince map[string]uint64
	// SnapshotGUIDs are, on a replica, the GUIDs of all its snapshots,
	// oldest first: what a push to it plans its increment from.
	SnapshotGUIDs []uint64
	// replication is the short names of its replication snapshots.
	replication []string
	// newestReceived is, on a replica, the full name of its newest
	// replication snapshot in creation order (not by the time in its
	// name: the source's clock may have stepped back since an earlier
	// one); "" on a primary.
	newestReceived string
	// quota is the dataset's quota property as set (QuotaProperty), 0
	// when unset: a replica received with its primary's quota needs no
	// separate step to set it when promoted.
	quota uint64
}

// notDemoted is the value of PropDemotedAt on a copy promoted since its
// demotion.
const notDemoted = "-"

func movingTo(ds zfs.Dataset) string {
	return copyrecord.MovingTo(ds.User[copyrecord.PropMovingTo])
}

func fencedAt(ds zfs.Dataset) int64 {
	at, _ := copyrecord.FencedAt(ds.User[copyrecord.PropFencedAt])
	return at
}

// readCopy reads the dataset of volume id under root, and whether it is
// a copy of it (a primary or a replica labelled with that ID).
func readCopy(ctx context.Context, z zfs.Reader, root, id string) (zfs.Dataset, bool, error) {
	ds, err := z.Get(ctx, datasetFor(root, id))
	if errors.Is(err, zfs.ErrNotFound) {
		return zfs.Dataset{}, false, nil
	}
	if err != nil {
		return zfs.Dataset{}, false, zfsError(err, "reading the copy of "+id)
	}
	role := ds.User[copyrecord.PropRole]
	return ds, ds.User[copyrecord.PropVolumeID] == id && (role == contract.RolePrimary || role == contract.RoleReplica), nil
}

// Copy describes this node's copy of volume id; Exists is false if there is
// none.
func (m *Manager) Copy(ctx context.Context, id string) (Copy, error) {
	out := Copy{VolumeID: id}
	if !contract.IsVolumeID(id) {
		return out, nil
	}
	dataset := datasetFor(m.cfg.RootDataset, id)
	ds, exists, err := readCopy(ctx, m.zfs, m.cfg.RootDataset, id)
	if err != nil || !exists {
		return out, err
	}
	role := ds.User[copyrecord.PropRole]
	out.Exists, out.Role, out.Name = true, role, ds.User[copyrecord.PropName]
	volumelog.Learn(id, out.Name)
	out.Generation, _ = strconv.ParseUint(ds.User[copyrecord.PropGeneration], 10, 64)
	out.MovingTo = movingTo(ds)
	out.FencedAt = fencedAt(ds)
	out.Parameters = copyrecord.DecodeParameters(ds.User[copyrecord.PropParameters])
	out.FailoverFrom = ds.User[copyrecord.PropFailoverLag]
	out.Forced, _ = strconv.ParseUint(ds.User[copyrecord.PropForced], 10, 64)
	out.HistoryFrom = copyrecord.HistoryFrom(ds.User[copyrecord.PropHistoryFrom], out.Generation)
	out.LeaseFenced = leaseFencedAt(ds.User[copyrecord.PropLeaseFenced]) != 0
	out.Capacity, _ = strconv.ParseUint(ds.User[copyrecord.PropCapacity], 10, 64)
	out.quota = ds.RefQuota
	if m.cfg.QuotaProperty == "quota" {
		out.quota = ds.Quota
	}
	if role == contract.RolePrimary {
		out.Capacity = out.quota
	}
	snapshots, guids, err := m.snapshotsOf(ctx, dataset, role)
	if err != nil {
		return out, zfsError(err, "listing the snapshots of "+id)
	}
	out.SnapshotGUIDs = guids
	var replication []string
	for _, s := range snapshots {
		at, ok := contract.ReplicationSnapshotTime(s)
		if !ok {
			continue
		}
		short := shortName(s)
		replication = append(replication, short)
		if role == contract.RoleReplica {
			out.newestReceived = s // a replica's listing is in creation order
		}
		if at >= out.LastSnapshotAt {
			out.LastSnapshot, out.LastSnapshotAt = short, at
		}
	}
	out.replication = replication
	if out.Mounted, err = m.mounted(dataset); err != nil {
		return out, err
	}
	if role == contract.RolePrimary && !out.Mounted {
		out.WrittenSince = m.writtenSince(ctx, dataset, replication)
	}
	return out, nil
}

// snapshotsOf lists the snapshots of a copy's dataset, in one listing:
// a replica's with their GUIDs (a push plans its increment from them),
// a primary's by name only, which the kernel lists without reading each
// snapshot's properties (a replication snapshot's time is in its name).
func (m *Manager) snapshotsOf(ctx context.Context, dataset, role string) ([]string, []uint64, error) {
	if role != contract.RoleReplica {
		names, err := m.zfs.SnapshotNames(ctx, dataset)
		return names, nil, err
	}
	snaps, err := m.zfs.Snapshots(ctx, dataset)
	if err != nil {
		return nil, nil, err
	}
	names, guids := make([]string, len(snaps)), make([]uint64, len(snaps))
	for i, s := range snaps {
		names[i], guids[i] = s.Name, s.GUID
	}
	return names, guids, nil
}

// writtenSince reads the bytes written to dataset since each of
// snapshots, where ZFS tells (a snapshot destroyed since it was listed
// does not): an estimate the controller may go without, so what is not
// read is left out, not an error.
func (m *Manager) writtenSince(ctx context.Context, dataset string, snapshots []string) map[string]uint64 {
	if len(snapshots) == 0 {
		return nil
	}
	props := make([]string, len(snapshots))
	for i, s := range snapshots {
		props[i] = "written@" + s
	}
	values, err := m.zfs.Properties(ctx, dataset, props...)
	if err != nil {
		return nil
	}
	out := make(map[string]uint64, len(snapshots))
	for i, s := range snapshots {
		if n, err := strconv.ParseUint(values[props[i]], 10, 64); err == nil {
			out[s] = n
		}
	}
	return out
}

func (m *Manager) mounted(dataset string) (bool, error) {
	if m.host.Mounted == nil {
		return false, nil
	}
	mounted, err := m.host.Mounted(dataset)
	if err != nil {
		return false, fmt.Errorf("reading the mount table: %w", err)
	}
	return mounted, nil
}

// Fence makes the primary read-only and marks it as moving to target, so
// that nothing writes it after the final snapshot. It is refused while the
// volume is mounted here (the CO must unpublish it first), and unless this
// node promised target a newer generation (checkPromisedTo). It returns when
// the fence went up (unix nanos): replication snapshots taken after that
// hold everything the volume will ever have here.
func (m *Manager) Fence(ctx context.Context, id, target string) (int64, error) {
	unlock, err := m.lock(ctx, id, "fence")
	if err != nil {
		return 0, err
	}
	defer unlock()
	return m.FenceHeld(ctx, id, target, m.now().UnixNano())
}

// FenceHeld is Fence for a caller that holds the copy's lock: a move's
// final push, which takes its snapshot under the same hold (the two
// writes then share a pool sync). at is the fence's time; a copy fenced
// for target already keeps its earlier one.
func (m *Manager) FenceHeld(ctx context.Context, id, target string, at int64) (int64, error) {
	// The schedule skips a volume being moved: it must learn of it.
	defer m.index.reindex(ctx, id)
	v, err := m.get(ctx, id)
	if err != nil {
		return 0, err
	}
	if v.MovingTo == target {
		if v.KeyLoaded {
			m.dropKey(ctx, id, v.Dataset, "fenced for a move")
		}
		return v.FencedAt, nil
	}
	mounted, err := m.mounted(v.Dataset)
	if err != nil {
		return 0, err
	}
	if mounted {
		return 0, fmt.Errorf("%w: volume %s is still mounted on node %s; it can move to node %s once the CO has unpublished it there",
			errdefs.ErrFailedPrecondition, id, m.cfg.NodeID, target)
	}
	if err := m.records.checkPromisedTo(ctx, v, target); err != nil {
		return 0, err
	}
	props := map[string]string{"readonly": "on", copyrecord.PropMovingTo: target, copyrecord.PropFencedAt: strconv.FormatInt(at, 10)}
	if err := m.zfs.SetProperties(ctx, v.Dataset, props); err != nil {
		return 0, zfsError(err, "fencing volume "+id)
	}
	m.log.Info("volume fenced for a move: read-only until the target is promoted", "volume_id", id, "target_node", target)
	if v.KeyLoaded {
		// A fenced copy is staged nowhere: its key goes.
		m.dropKey(ctx, id, v.Dataset, "fenced for a move")
	}
	return at, nil
}

// Unfence lifts a fence: the move was abandoned and this copy stays the
// primary. It refuses while this node's own promise record gives a
// generation above the copy's to another node (checkNotPromisedAway).
func (m *Manager) Unfence(ctx context.Context, id string, generation uint64) error {
	unlock, err := m.lock(ctx, id, "unfence")
	if err != nil {
		return err
	}
	defer unlock()
	// The schedule skips a volume being moved: it must learn of it.
	defer m.index.reindex(ctx, id)
	v, err := m.get(ctx, id)
	if err != nil {
		return err
	}
	if v.MovingTo != "" || v.LeaseFencedAt != 0 {
		if err := m.records.checkNotPromisedAway(ctx, v); err != nil {
			return err
		}
	}
	if v.LeaseFencedAt != 0 && v.MovingTo == "" {
		return m.fences.liftLeaseFence(ctx, v, generation)
	}
	if v.MovingTo == "" {
		return nil
	}
	if err := m.zfs.SetProperties(ctx, v.Dataset, map[string]string{"readonly": "off", copyrecord.PropMovingTo: copyrecord.NotMoving}); err != nil {
		return zfsError(err, "unfencing volume "+id)
	}
	m.log.Info("move abandoned; volume writable again", "volume_id", id, "was_moving_to", v.MovingTo)
	return nil
}

// Promote turns this node's replica into the primary at generation. For a
// planned move (notBefore > 0, the fence's time) the replica must hold the
// snapshot the source took with its fence, so nothing written there is
// missing. failover
// records the newest snapshot the replica had: the recovery point. A
// receive into the replica that is running finishes first (it holds the
// lock), and an interrupted one is discarded (copyrecord's DiscardPartial).
func (m *Manager) Promote(ctx context.Context, id string, generation uint64, notBefore int64, source string, failover bool) (Copy, error) {
	unlock, err := m.lock(ctx, id, "promote")
	if err != nil {
		return Copy{}, err
	}
	defer unlock()
	// Whether it is a primary may change: the index reads it again.
	defer m.index.reindex(ctx, id)
	if m.replicas != nil {
		if err := m.replicas.DiscardPartial(ctx, id); err != nil {
			return Copy{}, err
		}
	}
	c, err := m.Copy(ctx, id)
	if err != nil {
		return Copy{}, err
	}
	// The promise's lock is held from the check to the promotion: a
	// reservation that supersedes the promise (a publish to the move's
	// source voiding it, docs/safety.md "A publish to the source while a
	// move runs") lands either before the check, which then refuses, or
	// after the promotion, which the controller's next look then sees.
	unlockPromise, err := m.records.lockPromise(ctx, id)
	if err != nil {
		return Copy{}, err
	}
	defer unlockPromise()
	if promoted := c.Exists && c.Role == contract.RolePrimary && c.Generation == generation; !promoted {
		if err := m.records.checkPromised(ctx, id, generation); err != nil {
			return Copy{}, err
		}
	}
	if err := m.promote(ctx, c, generation, notBefore, source, failover); err != nil {
		return Copy{}, err
	}
	c.Role, c.Generation, c.MovingTo = contract.RolePrimary, generation, ""
	m.fences.Confirm(id, generation) // a majority promised it to this copy first
	m.wakeAwaited(id)
	if failover {
		c.FailoverFrom = c.LastSnapshot
	}
	return c, nil
}

func (m *Manager) promote(ctx context.Context, c Copy, generation uint64, notBefore int64, source string, failover bool) error {
	id := c.VolumeID
	log := m.log.With("volume_id", id, "generation", generation)
	switch {
	case !c.Exists:
		return fmt.Errorf("%w: node %s holds no copy of volume %s to promote", errdefs.ErrNotFound, m.cfg.NodeID, id)
	case c.Role == contract.RolePrimary && c.Generation == generation:
		return nil // promoted already
	case c.Role != contract.RoleReplica:
		return fmt.Errorf("%w: node %s holds volume %s as %s generation %d, not as a replica", errdefs.ErrFailedPrecondition, m.cfg.NodeID, id, c.Role, c.Generation)
	case generation <= c.Generation:
		return fmt.Errorf("%w: promoting volume %s to generation %d, but this replica is already at %d", errdefs.ErrFailedPrecondition, id, generation, c.Generation)
	case notBefore > 0 && !slices.Contains(c.replication, contract.ReplicationSnapshotName(notBefore)):
		// The fence's own snapshot, by its exact name: a fenced source
		// takes no other after it (replication.Pusher), and a name's
		// time proves nothing of order (the source's clock may have
		// stepped back since an earlier snapshot named later).
		return fmt.Errorf("%w: this replica of volume %s lacks the source's final snapshot %s (its newest is %s): send the final snapshot first",
			errdefs.ErrFailedPrecondition, id, contract.ReplicationSnapshotName(notBefore), c.LastSnapshot)
	}
	props, _, err := ResolveProperties(&m.cfg, c.Parameters)
	if err != nil {
		return fmt.Errorf("%w: volume %s's parameters are not allowed on node %s: %v", errdefs.ErrFailedPrecondition, id, m.cfg.NodeID, err)
	}
	for p := range createOnlyProperties {
		delete(props, p) // the copy has them from its stream
	}
	dataset := datasetFor(m.cfg.RootDataset, id)
	// The quota first, on its own: ZFS sets a quota in a step of its own
	// anyway, and a promotion that stops between the two steps must leave
	// a replica with a quota, never a primary without one. A retry then
	// finishes it. A replica usually has it already from its receives;
	// each property change waits for a pool sync, which a move waits for.
	if c.Capacity > 0 && c.quota != c.Capacity {
		quota := map[string]string{m.cfg.QuotaProperty: strconv.FormatUint(c.Capacity, 10)}
		if err := m.zfs.SetProperties(ctx, dataset, quota); err != nil {
			return zfsError(err, "setting the quota of volume "+id+" before promoting it")
		}
	}
	props["readonly"] = "off"
	props[copyrecord.PropRole] = contract.RolePrimary
	props[copyrecord.PropGeneration] = strconv.FormatUint(generation, 10)
	props[copyrecord.PropMovingTo] = copyrecord.NotMoving
	props[copyrecord.PropDemotedAt] = notDemoted
	// A planned move's replica holds the fenced primary's last state, so
	// it vouches for all the fenced primary vouched for; a failover's may
	// lack the lost primary's last writes, and vouches for nothing older.
	props[copyrecord.PropHistoryFrom] = strconv.FormatUint(c.HistoryFrom, 10)
	if failover {
		props[copyrecord.PropFailoverLag] = c.LastSnapshot
		props[copyrecord.PropHistoryFrom] = strconv.FormatUint(generation, 10)
	}
	held := m.holdSourcesBase(ctx, c, source, failover, log)
	err = m.zfs.SetProperties(ctx, dataset, props)
	held()
	if err != nil {
		return zfsError(err, "promoting volume "+id)
	}
	if failover {
		log.Warn("replica promoted by failover: writes on the lost primary after this snapshot are not here", "last_snapshot", c.LastSnapshot)
	} else {
		log.Info("replica promoted to primary", "last_snapshot", c.LastSnapshot)
	}
	return nil
}

// holdSourcesBase holds, for a planned move, the promoted copy's newest
// snapshot (the final one) as the base of the move's source, which the
// move demotes to a replica holding that snapshot: as a push to the source
// would have held it. Otherwise this primary would prune it once its
// pushes to other replicas moved on, and the source's replica, of this
// copy's generation and ahead of its snapshots, would refuse every push
// until the volume's next move (docs/replication.md, "A replica is never
// ahead of its primary's snapshots"). It runs beside the promotion's write
// (a hold waits for a pool sync as a property change does), and the
// function it returns waits for it. Best effort: a hold that fails leaves
// that replica to be removed or replaced, never a write lost.
func (m *Manager) holdSourcesBase(ctx context.Context, c Copy, source string, failover bool, log hclog.Logger) (wait func()) {
	if failover || source == "" || source == m.cfg.NodeID {
		return func() {}
	}
	// The newest received, which the source holds too, as the
	// promotion's own reading of the copy lists it (under the copy's
	// lock, so nothing was received since).
	newest := c.newestReceived
	if newest == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := m.zfs.Hold(ctx, newest, copyrecord.PeerBaseTag(source)); err != nil {
			log.Warn("holding the final snapshot as the move's source's base failed; that replica's pushes may need it removed",
				"snapshot", newest, "source", source, "error", err)
		}
	}()
	return func() { <-done }
}

// Demote retires this node's primary of volume id in favour of a primary of
// a newer generation elsewhere. A fenced primary (a planned move) becomes a
// replica: it has nothing the new primary lacks. Any other, or with aside,
// is renamed to <id>-aside-<nanos>: it may hold writes made after the last
// replication, so it is kept for an operator, never destroyed and never
// mounted.
func (m *Manager) Demote(ctx context.Context, id string, generation uint64, aside bool) error {
	unlock, err := m.lock(ctx, id, "demote")
	if err != nil {
		return err
	}
	defer unlock()
	// Whether it is a primary may change: the index reads it again.
	defer m.index.reindex(ctx, id)
	// A push of this copy stops first: a replica or a copy set aside sends
	// nothing.
	if err := m.locks.StopTransfer(ctx, id); err != nil {
		return err
	}
	c, err := m.Copy(ctx, id)
	if err != nil {
		return err
	}
	dataset := datasetFor(m.cfg.RootDataset, id)
	switch {
	case !c.Exists:
		return nil // set aside already
	case c.Role == contract.RoleReplica:
		// Demoted already; a demotion that stopped before its key was
		// unloaded gets it unloaded now.
		m.dropKey(ctx, id, dataset, "demoted to a replica")
		return nil
	case c.Generation >= generation:
		return fmt.Errorf("%w: node %s holds volume %s at generation %d, not older than %d: refusing to demote it",
			errdefs.ErrFailedPrecondition, m.cfg.NodeID, id, c.Generation, generation)
	case c.Mounted:
		return fmt.Errorf("%w: volume %s is mounted on node %s while generation %d is the primary elsewhere; unmount it: it is stale",
			errdefs.ErrFailedPrecondition, id, m.cfg.NodeID, generation)
	}
	log := m.log.With("volume_id", id, "generation", c.Generation, "new_generation", generation)
	// A replica or a set-aside copy is staged nowhere: its key goes
	// first, so no demotion that stops half-way leaves one loaded.
	m.dropKey(ctx, id, dataset, "demoted")
	if c.MovingTo != "" && !aside {
		// Marked as demoted: once the volume's other replicas are as
		// fresh, the schedule removes it if the volume wants no more
		// replicas (docs/replication.md, "Surplus copies").
		props := map[string]string{"readonly": "on", copyrecord.PropRole: contract.RoleReplica, copyrecord.PropGeneration: strconv.FormatUint(generation, 10),
			copyrecord.PropMovingTo: copyrecord.NotMoving, copyrecord.PropCapacity: strconv.FormatUint(c.Capacity, 10), copyrecord.PropDemotedAt: strconv.FormatInt(m.now().Unix(), 10)}
		if err := m.zfs.SetProperties(ctx, dataset, props); err != nil {
			return zfsError(err, "demoting volume "+id)
		}
		log.Info("primary demoted to a replica after its move", "moved_to", c.MovingTo)
		return nil
	}
	now := m.now()
	props := copyrecord.SetAsideLabels(now)
	if err := m.zfs.SetProperties(ctx, dataset, props); err != nil {
		return zfsError(err, "setting volume "+id+" aside")
	}
	asideName := copyrecord.AsideName(dataset, now)
	if err := m.zfs.Rename(ctx, dataset, asideName); err != nil {
		return zfsError(err, "renaming stale volume "+id+" aside")
	}
	m.index.reindexSnapshotsOf(ctx, asideName) // its CSI snapshots moved with it
	// Its replication holds protected bases for peers that have moved on;
	// left in place they would make the operator's zfs destroy fail.
	if err := m.releaseHolds(ctx, asideName); err != nil {
		log.Warn("releasing the set-aside copy's holds failed; zfs release them before destroying it", "dataset", asideName, "error", err)
	}
	log.Warn("stale primary set aside: it may hold writes made after its last replication; an operator decides what to keep",
		"dataset", asideName, "last_snapshot", c.LastSnapshot)
	return nil
}

// Stageable returns the primary for staging after checking that this node
// may mount it: not fenced for a move and of the generation the CO
// published (0: not checked). unlock must be called once it is mounted, so
// no fence or demotion overtakes the mount.
func (m *Manager) Stageable(ctx context.Context, id string, generation uint64) (Volume, func(), error) {
	unlock, err := m.lock(ctx, id, "stage")
	if err != nil {
		return Volume{}, nil, err
	}
	v, err := m.get(ctx, id)
	switch {
	case err != nil:
	case v.MovingTo != "":
		err = fmt.Errorf("%w: volume %s is moving to node %s and cannot be staged on node %s", errdefs.ErrFailedPrecondition, id, v.MovingTo, m.cfg.NodeID)
	case m.fences.leaseLost() && !v.Forced:
		err = fmt.Errorf("%w: node %s hears from no majority of its peers (lease lost): another copy of volume %s may be promoted meanwhile, so it is not staged; retry once the node's peers answer",
			errdefs.ErrUnavailable, m.cfg.NodeID, id)
	case v.SupersededBy != 0:
		err = fmt.Errorf("%w: node %s learned that generation %d of volume %s was promised to another node: its copy (generation %d) may be stale, so it is read-only and not staged; "+
			"stop the allocation using it on this node and publish the volume again: the controller publishes the newest copy and sets this one aside",
			errdefs.ErrFailedPrecondition, m.cfg.NodeID, v.SupersededBy, id, v.Generation)
	case v.LeaseFencedAt != 0:
		err = fmt.Errorf("%w: volume %s is read-only since node %s lost its lease; it is staged again once a majority of the domain confirms no newer copy exists (within a lease time)",
			errdefs.ErrUnavailable, id, m.cfg.NodeID)
	case generation != 0 && v.Generation != generation:
		err = fmt.Errorf("%w: node %s holds volume %s at generation %d but generation %d was published: refusing a stale copy",
			errdefs.ErrFailedPrecondition, m.cfg.NodeID, id, v.Generation, generation)
	default:
		err = m.fences.checkConfirmed(v)
	}
	if err != nil {
		unlock()
		return Volume{}, nil, err
	}
	return v, unlock, nil
}

// releaseHolds releases every hold on the snapshots of dataset.
func (m *Manager) releaseHolds(ctx context.Context, dataset string) error {
	all, err := m.zfs.List(ctx, dataset)
	if err != nil {
		return err
	}
	for _, ds := range all {
		if ds.Type == zfs.Snapshot {
			if err := m.zfs.ReleaseAll(ctx, ds.Name); err != nil {
				return err
			}
		}
	}
	return nil
}
