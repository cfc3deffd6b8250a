// Package volume is the node's volume logic: CSI volumes and snapshots as
// ZFS datasets under the operator's root dataset, named by IDs derived from
// their CSI names and labelled with the driver's user properties.
//
// The node agent service (for the controller) and the CSI node service both
// call the Manager; neither touches ZFS directly. Rules (docs/volumes.md):
//   - every volume is <root>/<volume id>, mountpoint=legacy, mounted only by
//     the CSI node service;
//   - a CSI snapshot is <root>/<volume id>@<snapshot id>;
//   - snapshots are independent of their volume: deleting a volume that has
//     snapshots turns it into a hidden tombstone, destroyed with its last
//     snapshot;
//   - clones stay valid after their origin is deleted: an origin snapshot
//     with clones is destroyed deferred (zfs destroy -d) and vanishes with
//     its last clone.
package volume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/keylock"
)

// Volume is a CSI volume on this node.
type Volume struct {
	ID         string
	Name       string
	Dataset    string
	Capacity   uint64 // the quota
	Used       uint64
	Parameters map[string]string
	// Source is "snapshot:ID", "volume:ID" or "".
	Source     string
	Generation uint64
	Created    time.Time
	// MovingTo is set while the volume is fenced for a move to that node,
	// since FencedAt (unix nanos).
	MovingTo string
	FencedAt int64
	// FailoverFrom is set on a primary promoted by failover: the newest
	// snapshot it had then.
	FailoverFrom string
	// LeaseFencedAt is set (unix nanos) while the volume is read-only
	// because its node lost its lease.
	LeaseFencedAt int64
	// SupersededBy is set, with LeaseFencedAt, while the volume is
	// read-only because this node learned that a newer generation of it
	// was promised elsewhere (FenceSuperseded): that generation.
	SupersededBy uint64
	// Forced is set while the volume is the copy an operator promoted
	// without a majority (promote -force) at its current generation: the
	// lease does not apply to it, on the operator's word.
	Forced bool
	// RootPending is set while the root directory's owner and mode the
	// parameters ask for are still to be set (prepareRoot).
	RootPending bool
	// Encrypted, KeyRoot and KeyLoaded are the dataset's (zfs.Dataset):
	// an encrypted volume is mounted only with its key loaded (keys.go).
	Encrypted, KeyRoot, KeyLoaded bool
}

// Snapshot is a CSI snapshot on this node.
type Snapshot struct {
	ID             string
	Name           string
	SourceVolumeID string
	Dataset        string
	// Size is the data the snapshot refers to: a volume restored from it
	// needs at least this much.
	Size    uint64
	Created time.Time
	// GUID and CreateTXG are ZFS's (zfs.Dataset): copies of one snapshot
	// on the node are the same snapshot only when their GUIDs agree, and
	// the lower CreateTXG was on the node first.
	GUID      uint64
	CreateTXG uint64
}

// Capacity is what placement needs to know about this node.
type Capacity struct {
	Available uint64 // free space under the root dataset
	MaxQuota  uint64
	Volumes   int
}

// CreateRequest asks for a volume. The name is the CSI name; capacity values
// are 0 when unset; at most one source is set.
type CreateRequest = contract.VolumeRequest

// Manager runs volume operations on one node. Operations on one volume are
// serialised; different volumes proceed in parallel as far as ZFS allows.
type Manager struct {
	// DiscardPartialReceive, when set, discards an interrupted receive into
	// the volume's replica (replication.Receiver.DiscardPartial). Promote
	// calls it holding the volume's lock, so no receive starts between
	// the discard and the promotion.
	DiscardPartialReceive func(ctx context.Context, volumeID string) error
	// Mounted, when set, reports whether a dataset is mounted on this node;
	// a mounted primary is never fenced or demoted.
	Mounted func(dataset string) (bool, error)
	// MountHolders, when set, names the processes in other mount
	// namespaces that see a dataset mounted (mount.Holders): a delete
	// is refused before it touches anything while any holds the volume,
	// and says who does.
	MountHolders func(dataset string) []string
	// LeaseHeld, when set, reports whether this node holds its lease
	// (package lease); no primary is staged while it does not.
	LeaseHeld func() bool
	// Roots sets the owner and mode of new volumes' root directories;
	// without it a create that asks for them fails.
	Roots RootPreparer
	// Encryption creates and copies encrypted volumes and loads and
	// unloads their keys (keys.go); without it a create that asks for
	// encryption fails.
	Encryption zfs.Encryption

	zfs   zfs.Interface
	cfg   config.Node
	log   hclog.Logger
	locks *copylock.Locks
	// promiseLocks serialise the reads and writes of each volume's
	// promise record (promise.go). It is not the copy: Reserve takes only
	// this lock, so a reservation never waits for a receive or a push of
	// the copy; anything that needs both takes the copy's lock first.
	promiseLocks keylock.Locks
	// legacyPromises tells that promise records may be kept on the root
	// dataset (CheckLegacyPromises); true until the node has looked.
	legacyPromises atomic.Bool
	now            func() time.Time
	confirmed      confirmations
	// primaryIndex and snapshotIndex: see index.go. primariesListed and
	// snapshotsListed tell whether each was listed once since the start.
	primaryIndex, snapshotIndex      idIndex
	primariesListed, snapshotsListed atomic.Bool
	started                          time.Time // of the process: part of VolumesVersion
	// sweeping tells whether the tombstones a listing found are being
	// collected (collectTombstones).
	sweepMu  sync.Mutex
	sweeping bool
	// deleted: the records of snapshots deleted while a node was away
	// (deleted.go).
	deleted deletedRecords
	// duplicates: the second copies of CSI snapshots the last listing
	// found (snapshotDuplicates in index.go).
	duplicates snapshotDuplicates
	// awaited: the stages waiting for a promotion (awaited.go).
	awaited awaitedPromotions
}

// NewManager returns a Manager for the node described by cfg.
func NewManager(z zfs.Interface, cfg config.Node, log hclog.Logger) *Manager {
	m := &Manager{zfs: z, cfg: cfg, log: log, now: time.Now, locks: new(copylock.Locks), started: time.Now()}
	m.legacyPromises.Store(true)
	return m
}

// UseClock sets the node's wall clock (time.Now by default), which names
// set-aside copies and dates fences: the simulation skews it per node.
// No decision compares two nodes' readings of it (docs/safety.md).
func (m *Manager) UseClock(now func() time.Time) { m.now = now }

// Locks is the one lock of each copy on this node (package copylock): the
// replication pusher and receiver change copies under it too.
func (m *Manager) Locks() *copylock.Locks { return m.locks }

// Health says whether this node can do its job: pool online, root dataset
// present.
func (m *Manager) Health(ctx context.Context) error {
	if err := m.zfs.PoolHealth(ctx, m.cfg.Pool()); err != nil {
		return fmt.Errorf("%w: %v", errdefs.ErrUnavailable, err)
	}
	ds, err := m.zfs.Get(ctx, m.cfg.RootDataset)
	if err != nil {
		return fmt.Errorf("%w: root dataset %s: %v (create it: zfs create -p %s)", errdefs.ErrUnavailable, m.cfg.RootDataset, err, m.cfg.RootDataset)
	}
	if ds.Type != zfs.Filesystem {
		return fmt.Errorf("%w: root dataset %s is not a filesystem", errdefs.ErrUnavailable, m.cfg.RootDataset)
	}
	if ds.ReadOnly {
		return fmt.Errorf("%w: root dataset %s is readonly=on, so no volume can be written (zfs set readonly=off %s)", errdefs.ErrUnavailable, m.cfg.RootDataset, m.cfg.RootDataset)
	}
	return nil
}

// lock takes the lock of a volume's copy, or of a snapshot ID, for the
// change what (package copylock).
func (m *Manager) lock(ctx context.Context, id, what string) (func(), error) {
	return m.locks.Lock(ctx, id, what)
}

// Create creates a volume, or returns the one an earlier identical request
// created. A request that differs from the existing volume of the same name
// fails with ErrAlreadyExists.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Volume, error) {
	spec, err := m.resolveCreate(req)
	if err != nil {
		return Volume{}, err
	}
	id := contract.VolumeIDForName(req.Name)
	unlock, err := m.lock(ctx, id, "create")
	if err != nil {
		return Volume{}, err
	}
	defer unlock()
	// Whether it is a primary may change: the index reads it again.
	defer m.reindex(ctx, id)

	existing, err := m.get(ctx, id)
	switch {
	case err == nil:
		return m.createAgain(ctx, existing, req, spec)
	case !errors.Is(err, errdefs.ErrNotFound):
		return Volume{}, err
	}
	return m.createNew(ctx, id, req, spec)
}

// createSpec is what a create request asks for, under the operator's
// configuration.
type createSpec struct {
	quota    uint64
	props    map[string]string // the dataset's properties the submitter chose
	recorded map[string]string // the parameters kept with the volume
	root     Root              // the root directory's owner and mode
	setRoot  bool              // the request set root
	source   string            // "snapshot:ID", "volume:ID" or ""
}

// resolveCreate checks a create request against the operator's
// configuration and resolves it, before any lock is taken or ZFS asked.
func (m *Manager) resolveCreate(req CreateRequest) (spec createSpec, err error) {
	if err := contract.ValidateName("volume", req.Name); err != nil {
		return spec, err
	}
	if spec.quota, err = ResolveQuota(&m.cfg, req.RequiredBytes, req.LimitBytes); err != nil {
		return spec, err
	}
	if spec.props, spec.recorded, err = ResolveProperties(&m.cfg, req.Parameters); err != nil {
		return spec, err
	}
	if spec.root, spec.setRoot, err = ResolveRoot(&m.cfg, req.Parameters); err != nil {
		return spec, err
	}
	switch {
	case req.SourceSnapshotID != "" && req.SourceVolumeID != "":
		return spec, fmt.Errorf("%w: a volume has at most one source", errdefs.ErrInvalidArgument)
	case req.SourceSnapshotID != "":
		spec.source = "snapshot:" + req.SourceSnapshotID
	case req.SourceVolumeID != "":
		spec.source = "volume:" + req.SourceVolumeID
	}
	return spec, nil
}

// createAgain answers a create of a volume that exists: the same volume
// if the request is the one that created it, after finishing what that
// create left undone.
func (m *Manager) createAgain(ctx context.Context, existing Volume, req CreateRequest, spec createSpec) (Volume, error) {
	log := m.log.With("volume_id", existing.ID)
	if err := compatible(existing, req.Name, spec.quota, req.LimitBytes, spec.recorded, spec.source); err != nil {
		return Volume{}, err
	}
	if existing.RootPending {
		log.Info("finishing the root directory of a create that stopped half-way", "root", spec.root.String())
		if err := m.finishRoot(ctx, existing, spec.root, req.Passphrase); err != nil {
			return Volume{}, err
		}
		return m.get(ctx, existing.ID)
	}
	if err := m.dropCopiedSnapshot(ctx, existing); err != nil {
		return Volume{}, err
	}
	log.Debug("volume exists; create is a no-op")
	return existing, nil
}

// createNew creates volume id's dataset, sets its root directory and
// leaves its key unloaded.
func (m *Manager) createNew(ctx context.Context, id string, req CreateRequest, spec createSpec) (Volume, error) {
	props := spec.props
	props[m.cfg.QuotaProperty] = strconv.FormatUint(spec.quota, 10)
	props["mountpoint"] = "legacy"
	props[PropVolumeID] = id
	props[PropName] = req.Name
	props[PropRole] = contract.RolePrimary
	props[PropParameters] = EncodeParameters(spec.recorded)
	props[PropSource] = spec.source
	if spec.setRoot {
		if m.Roots == nil {
			return Volume{}, fmt.Errorf("%w: this node cannot set a volume's root directory owner or mode; create the volume without uid, gid and mode", errdefs.ErrFailedPrecondition)
		}
		props[PropRootPending] = "true"
	}
	dataset := datasetFor(m.cfg.RootDataset, id)
	generation, err := m.createPromised(ctx, req, id, dataset, spec.quota, props)
	if err != nil {
		return Volume{}, err
	}
	m.Confirm(id, generation) // a majority promised it to this node first
	v, err := m.get(ctx, id)
	if err != nil {
		return Volume{}, err
	}
	if spec.setRoot {
		if err := m.finishRoot(ctx, v, spec.root, req.Passphrase); err != nil {
			return Volume{}, err
		}
		if v, err = m.get(ctx, id); err != nil {
			return Volume{}, err
		}
	}
	// Unload the key zfs create loaded: a volume's key is loaded only
	// while it is staged (keys.go).
	if v.KeyLoaded {
		if err := m.CloseKey(ctx, id); err != nil {
			return Volume{}, err
		}
		if v, err = m.get(ctx, id); err != nil {
			return Volume{}, err
		}
	}
	m.log.Info("volume created", "volume_id", id, "name", req.Name, "dataset", dataset, "quota", spec.quota, "source", spec.source, "encrypted", v.Encrypted)
	return v, nil
}

// createPromised creates the dataset of a new volume id at the generation
// this node was promised for it, and returns that generation. The
// controller has a majority promise generation 1 to one node before it
// creates (migration.ReserveCreation): a create that reaches another node
// (a late retry) must not make a second primary of it. Racing creations
// may split generation 1's promises, and a majority then promised this
// node a later one. The promise's lock is held until the dataset exists:
// a delete's reservation (contract.DeletionHolder) lands either before the
// check, which then refuses, or after the dataset exists, which the
// delete's next look finds.
func (m *Manager) createPromised(ctx context.Context, req CreateRequest, id, dataset string, quota uint64, props map[string]string) (uint64, error) {
	unlock, err := m.promiseLocks.Lock(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("%w: waiting for the promise record of volume %s: %v", errdefs.ErrAborted, id, err)
	}
	defer unlock()
	p, err := m.Promised(ctx, id)
	switch {
	case err != nil:
		return 0, err
	case p.Holder == contract.DeletionHolder:
		return 0, fmt.Errorf("%w: volume %s is being deleted (a delete of it reserved generation %d and has not finished), so it is not created; retry the delete, then the create",
			errdefs.ErrAborted, id, p.Generation)
	case p.Generation > 0 && p.Holder != m.cfg.NodeID:
		return 0, fmt.Errorf("%w: generation %d of volume %s was promised to node %s, so it is not created on node %s; retry the create, which goes there",
			errdefs.ErrFailedPrecondition, p.Generation, id, p.Holder, m.cfg.NodeID)
	}
	generation := max(p.Generation, 1)
	props[PropGeneration] = strconv.FormatUint(generation, 10)
	props[PropHistoryFrom] = strconv.FormatUint(generation, 10)
	switch {
	case req.SourceSnapshotID != "":
		err = m.cloneSnapshot(ctx, req.SourceSnapshotID, dataset, quota, props, req.Parameters)
	case req.SourceVolumeID != "":
		err = m.cloneVolume(ctx, req.SourceVolumeID, dataset, quota, props, req.Parameters)
	case encryptionAsked(props):
		err = m.createEncrypted(ctx, id, dataset, props, req.Passphrase)
	default:
		err = m.zfs.CreateFilesystem(ctx, dataset, props)
	}
	if err != nil {
		return 0, zfsError(err, "creating volume "+id)
	}
	return generation, nil
}

// compatible decides whether an existing volume satisfies a repeated create.
func compatible(v Volume, name string, quota, limit uint64, params map[string]string, source string) error {
	switch {
	case v.Name != name:
		// Two names hashing to one ID: astronomically unlikely, never silently merged.
		return fmt.Errorf("%w: volume %s belongs to name %q", errdefs.ErrAlreadyExists, v.ID, v.Name)
	case v.Capacity < quota || (limit > 0 && v.Capacity > limit):
		return fmt.Errorf("%w: volume %q exists with capacity %d, incompatible with the requested range", errdefs.ErrAlreadyExists, name, v.Capacity)
	case EncodeParameters(v.Parameters) != EncodeParameters(params):
		return fmt.Errorf("%w: volume %q exists with parameters %s, not %s", errdefs.ErrAlreadyExists, name, EncodeParameters(v.Parameters), EncodeParameters(params))
	case v.Source != source:
		return fmt.Errorf("%w: volume %q exists with source %q, not %q", errdefs.ErrAlreadyExists, name, v.Source, source)
	}
	return nil
}

func (m *Manager) cloneSnapshot(ctx context.Context, snapID, dataset string, quota uint64, props, params map[string]string) error {
	snap, err := m.findSnapshot(ctx, snapID)
	if err != nil {
		return err
	}
	if snap.Size > quota {
		return fmt.Errorf("%w: snapshot %s holds %d bytes, more than the requested capacity %d", errdefs.ErrOutOfRange, snapID, snap.Size, quota)
	}
	return m.copyOf(ctx, snap.Dataset, dataset, props, params)
}

// cloneVolume clones the current state of a volume through a private
// snapshot, which is destroyed deferred at once: ZFS removes it with the
// clone, so nothing is left to track.
func (m *Manager) cloneVolume(ctx context.Context, srcID, dataset string, quota uint64, props, params map[string]string) error {
	src, err := m.get(ctx, srcID)
	if err != nil {
		return err
	}
	if src.Used > quota {
		return fmt.Errorf("%w: volume %s holds %d bytes, more than the requested capacity %d", errdefs.ErrOutOfRange, srcID, src.Used, quota)
	}
	snap := src.Dataset + "@clone-" + shortName(dataset)
	if err := m.zfs.Snapshot(ctx, snap, nil); err != nil && !errors.Is(err, zfs.ErrExists) {
		return err
	}
	if err := m.copyOf(ctx, snap, dataset, props, params); err != nil {
		return err
	}
	return m.zfs.DestroyDeferred(ctx, snap)
}

// copyOf makes dataset a new volume from snapshot, with props: a clone,
// or for an encrypted snapshot a raw copy that is its own encryption root
// (keys.go, copyEncrypted). Either way the volume keeps its source's
// encryption, which a clone or a raw receive cannot change: a volume
// whose parameters ask for the other is refused, and the operator's
// default does not apply.
func (m *Manager) copyOf(ctx context.Context, snapshot, dataset string, props, params map[string]string) error {
	fs, err := m.zfs.Get(ctx, zfs.Parent(snapshot))
	if err != nil {
		return err
	}
	props = maps.Clone(props)
	delete(props, "encryption") // the operator's default does not apply
	if asked, ok := params["encryption"]; ok && (asked != "off") != fs.Encrypted {
		return fmt.Errorf("%w: a volume made from %s keeps its encryption (%s), and cannot have encryption=%s; leave encryption out of its parameters",
			errdefs.ErrInvalidArgument, snapshot, encryptionWord(fs.Encrypted), asked)
	}
	if fs.Encrypted && fs.KeyRoot {
		return m.copyEncrypted(ctx, snapshot, dataset, props)
	}
	// Not encrypted, or with the key of the root dataset (the operator
	// loads it): a clone opens as its source does.
	return m.zfs.Clone(ctx, snapshot, dataset, props)
}

// Get returns a volume by ID.
func (m *Manager) Get(ctx context.Context, id string) (Volume, error) {
	return m.get(ctx, id)
}

func (m *Manager) get(ctx context.Context, id string) (Volume, error) {
	if !contract.IsVolumeID(id) {
		return Volume{}, fmt.Errorf("%w: volume %q", errdefs.ErrNotFound, id)
	}
	ds, err := m.zfs.Get(ctx, datasetFor(m.cfg.RootDataset, id))
	if err != nil {
		return Volume{}, zfsError(err, "volume "+id)
	}
	v, ok := m.volumeOf(ds)
	switch {
	case ok:
		return v, nil
	case ds.User[PropVolumeID] == id && ds.User[PropRole] == contract.RoleReplica:
		// The operator's commands ask every node: a replica is no mystery.
		return Volume{}, fmt.Errorf("%w: node %s holds a replica of volume %s, not its primary", errdefs.ErrFailedPrecondition, m.cfg.NodeID, id)
	}
	return Volume{}, fmt.Errorf("%w: dataset %s exists but is not a volume of this driver (role %q); an operator must look at it",
		errdefs.ErrFailedPrecondition, ds.Name, ds.User[PropRole])
}

// volumeOf reads a volume from its dataset; ok is false for anything that is
// not a live primary volume.
func (m *Manager) volumeOf(ds zfs.Dataset) (Volume, bool) {
	id := ds.User[PropVolumeID]
	if ds.Type != zfs.Filesystem || ds.User[PropRole] != contract.RolePrimary || id != shortName(ds.Name) || zfs.Parent(ds.Name) != m.cfg.RootDataset {
		return Volume{}, false
	}
	capacity := ds.RefQuota
	if m.cfg.QuotaProperty == "quota" {
		capacity = ds.Quota
	}
	gen, _ := strconv.ParseUint(ds.User[PropGeneration], 10, 64)
	return Volume{
		ID:            id,
		Name:          ds.User[PropName],
		Dataset:       ds.Name,
		Capacity:      capacity,
		Used:          ds.Referenced,
		Parameters:    DecodeParameters(ds.User[PropParameters]),
		Source:        ds.User[PropSource],
		Generation:    gen,
		Created:       ds.Created,
		MovingTo:      movingTo(ds),
		FencedAt:      fencedAt(ds),
		FailoverFrom:  ds.User[PropFailoverLag],
		LeaseFencedAt: leaseFencedAt(ds.User[PropLeaseFenced]),
		SupersededBy:  supersededBy(ds.User[PropSuperseded]),
		Forced:        ds.User[PropForced] != "" && ds.User[PropForced] == ds.User[PropGeneration],
		RootPending:   ds.User[PropRootPending] != "",
		Encrypted:     ds.Encrypted,
		KeyRoot:       ds.KeyRoot,
		KeyLoaded:     ds.KeyLoaded,
	}, true
}

// List returns the node's volumes sorted by ID.
func (m *Manager) List(ctx context.Context) ([]Volume, error) {
	all, err := m.zfs.Children(ctx, m.cfg.RootDataset)
	if err != nil {
		return nil, zfsError(err, "listing volumes")
	}
	return m.volumesAmong(all), nil
}

// volumesAmong returns the primaries among the children of the node's
// root, in the order of their IDs.
func (m *Manager) volumesAmong(children []zfs.Dataset) []Volume {
	var out []Volume
	for _, ds := range children {
		if v, ok := m.volumeOf(ds); ok {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Delete deletes a volume. Deleting a volume that does not exist succeeds.
// A volume with snapshots becomes a tombstone (see the package comment).
func (m *Manager) Delete(ctx context.Context, id string) error {
	if !contract.IsVolumeID(id) {
		return nil // names no volume, so none to delete
	}
	log := m.log.With("volume_id", id)
	unlock, err := m.lock(ctx, id, "delete")
	if err != nil {
		return err
	}
	defer unlock()
	// Whether it is a primary may change: the index reads it again.
	defer m.reindex(ctx, id)

	v, err := m.get(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	// A mounted volume is refused before anything is touched: its
	// replication snapshots are the bases of its replicas' increments.
	// Mounted anywhere: in another mount namespace too, where ZFS would
	// answer EBUSY only at the destroy, after the snapshots were gone.
	if err := m.refuseMounted(v); err != nil {
		return err
	}
	// A push snapshots and sends this copy: it stops first, and the next
	// one waits for this lock and then finds no volume.
	if err := m.locks.StopTransfer(ctx, id); err != nil {
		return err
	}
	if err := m.dropReplicationSnapshots(ctx, v.Dataset); err != nil {
		return err
	}
	// A clone's origin snapshot, destroyed deferred, goes with it, and
	// may leave its tombstone free to go.
	var origin string
	if ds, err := m.zfs.Get(ctx, v.Dataset); err == nil {
		origin = ds.Origin
	}
	err = m.zfs.Destroy(ctx, v.Dataset)
	switch {
	case err == nil:
		log.Info("volume destroyed", "dataset", v.Dataset)
	case errors.Is(err, zfs.ErrNotFound):
		log.Info("volume already destroyed meanwhile", "dataset", v.Dataset)
	case errors.Is(err, zfs.ErrHasDependents):
		if err := m.tombstone(ctx, v); err != nil {
			return err
		}
		log.Info("volume deleted; its dataset stays as a tombstone until its snapshots and clones are gone", "dataset", v.Dataset)
	case errors.Is(err, zfs.ErrBusy):
		return m.busyError(v, err)
	default:
		return zfsError(err, "deleting volume "+id)
	}
	switch parent := zfs.Parent(origin); {
	case origin == "":
	case copyIDOfDataset(parent) == id: // restored from its own name's tombstone: this lock guards it
		m.collectTombstoneLocked(ctx, parent)
	default:
		m.collectTombstone(ctx, parent)
	}
	return nil
}

// refuseMounted answers FailedPrecondition for a volume mounted on this
// node: in the node's own mount table, or in any other mount namespace
// (a task's that outlived its unmount), naming the processes there.
func (m *Manager) refuseMounted(v Volume) error {
	mounted, err := m.mounted(v.Dataset)
	if err != nil {
		return err
	}
	if mounted {
		return fmt.Errorf("%w: volume %s is mounted on node %s; unpublish it first", errdefs.ErrFailedPrecondition, v.ID, m.cfg.NodeID)
	}
	if m.MountHolders == nil {
		return nil
	}
	if holders := m.MountHolders(v.Dataset); len(holders) > 0 {
		m.log.Warn("volume not deleted: mounted in other mount namespaces", "volume_id", v.ID, "dataset", v.Dataset, "holders", holders)
		return fmt.Errorf("%w: volume %s is mounted in other mount namespaces on node %s (%s); "+
			"unpublish it, or end those processes, then delete it again", errdefs.ErrFailedPrecondition, v.ID, m.cfg.NodeID, strings.Join(holders, "; "))
	}
	return nil
}

// busyError is Delete's answer when ZFS refuses to destroy v's dataset as
// busy although the node has it unmounted: mounted in another mount
// namespace (a task's that outlived its unmount), or open there.
func (m *Manager) busyError(v Volume, err error) error {
	where := "still mounted?"
	if m.MountHolders != nil {
		if holders := m.MountHolders(v.Dataset); len(holders) > 0 {
			where = "mounted in other mount namespaces: " + strings.Join(holders, "; ")
		}
	}
	m.log.Warn("volume not deleted: its dataset is busy", "volume_id", v.ID, "dataset", v.Dataset, "where", where, "error", err)
	return fmt.Errorf("%w: volume %s is in use (%s); unpublish it first: %v", errdefs.ErrFailedPrecondition, v.ID, where, err)
}

// dropReplicationSnapshots destroys a deleted volume's replication
// snapshots, releasing the holds that protected them as incremental bases:
// with the volume gone there is nothing left to send. Only CSI snapshots
// and clone origins may keep a deleted volume as a tombstone.
//
// A replication snapshot may vanish or gain a hold between the listing and
// its destruction (a push's tidy prunes and holds on its own schedule):
// one that is gone counts as destroyed, one held meanwhile is released
// again.
func (m *Manager) dropReplicationSnapshots(ctx context.Context, dataset string) error {
	all, err := m.zfs.List(ctx, dataset)
	if errors.Is(err, zfs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return zfsError(err, "listing snapshots of "+dataset)
	}
	for _, ds := range all {
		if ds.Type != zfs.Snapshot || !strings.HasPrefix(shortName(ds.Name), contract.ReplicationSnapshotPrefix) {
			continue
		}
		if err := m.releaseAndDestroy(ctx, ds.Name); err != nil {
			return err
		}
	}
	return nil
}

// releaseAndDestroy releases every hold on a snapshot and destroys it. A
// snapshot already gone is destroyed; one that a clone keeps stays for its
// tombstone; one held again meanwhile is released again, a few times.
func (m *Manager) releaseAndDestroy(ctx context.Context, snap string) error {
	const attempts = 3
	var err error
	for range attempts {
		err = m.zfs.ReleaseAll(ctx, snap)
		if errors.Is(err, zfs.ErrNotFound) {
			return nil
		}
		if err != nil {
			return zfsError(err, "releasing the holds on "+snap)
		}
		err = m.zfs.Destroy(ctx, snap)
		if err == nil || errors.Is(err, zfs.ErrNotFound) || errors.Is(err, zfs.ErrHasDependents) {
			return nil
		}
		if !errors.Is(err, zfs.ErrBusy) {
			break
		}
	}
	return zfsError(err, "destroying "+snap)
}

// tombstone hides a deleted volume that still has snapshots or clones: it is
// renamed out of the volume namespace (so the name can be reused) and
// labelled deleted.
func (m *Manager) tombstone(ctx context.Context, v Volume) error {
	now := m.now()
	err := m.zfs.SetProperties(ctx, v.Dataset, map[string]string{PropRole: contract.RoleDeleted, PropDeletedAt: now.UTC().Format(time.RFC3339)})
	if err != nil {
		return zfsError(err, "marking volume "+v.ID+" deleted")
	}
	target := TombstoneName(v.Dataset, now)
	if err := m.zfs.Rename(ctx, v.Dataset, target); err != nil {
		return zfsError(err, "renaming deleted volume "+v.ID)
	}
	m.reindexSnapshotsOf(ctx, target) // its CSI snapshots moved with it
	return nil
}

// TombstoneName is the name a copy at dataset takes when it becomes a
// tombstone at now: the volume's name is free again at once.
func TombstoneName(dataset string, now time.Time) string {
	return fmt.Sprintf("%s-deleted-%d", dataset, now.UnixNano())
}

// A tombstone goes when its last CSI snapshot and clone are gone: the
// deletes that can free one (of a snapshot on it, of a clone of one of
// its snapshots) collect that one tombstone (collectTombstone), and every
// listing of the node's primaries (at the node's start, and then at most
// every indexMaxAge, index.go) collects the ones it finds, which is what
// a crash between the two left behind. Tombstones are no copies: no copy
// lock guards them (docs/safety.md, "One owner of a copy").

// tombstonesAmong returns the tombstones among the children of the
// node's root.
func tombstonesAmong(children []zfs.Dataset) []string {
	var out []string
	for _, ds := range children {
		if ds.Type == zfs.Filesystem && ds.User[PropRole] == contract.RoleDeleted {
			out = append(out, ds.Name)
		}
	}
	return out
}

// collectTombstones collects the tombstones a listing found, apart from
// the listing and with its own deadline, unless the last ones are still
// being collected (the next listing finds what they leave). Best effort.
func (m *Manager) collectTombstones(tombstones []string) {
	if len(tombstones) == 0 {
		return
	}
	m.sweepMu.Lock()
	defer m.sweepMu.Unlock()
	if m.sweeping {
		return
	}
	m.sweeping = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), fillTimeout)
		defer cancel()
		for _, fs := range tombstones {
			m.collectTombstone(ctx, fs)
		}
		m.sweepMu.Lock()
		m.sweeping = false
		m.sweepMu.Unlock()
	}()
}

// collectTombstone destroys fs if it is a tombstone that no snapshot or
// clone needs any more, under its copy's lock: a tombstone whose rename
// was cut short by a crash still has the volume's own name, which a
// receive may be filling. Best effort: what cannot go now goes later.
func (m *Manager) collectTombstone(ctx context.Context, fs string) {
	unlock, err := m.lock(ctx, copyIDOfDataset(fs), "collecting a tombstone")
	if err != nil {
		return
	}
	defer unlock()
	m.collectTombstoneLocked(ctx, fs)
}

// collectTombstoneLocked is collectTombstone for a caller that holds the
// copy's lock.
func (m *Manager) collectTombstoneLocked(ctx context.Context, fs string) {
	ds, err := m.zfs.Get(ctx, fs)
	if err != nil || ds.Type != zfs.Filesystem || ds.User[PropRole] != contract.RoleDeleted {
		return
	}
	id := ds.User[PropVolumeID]
	if err := m.dropReplicationSnapshots(ctx, fs); err != nil {
		m.log.Warn("dropping a tombstone's replication snapshots failed", "volume_id", id, "error", err)
	}
	err = m.zfs.Destroy(ctx, fs)
	switch {
	case err == nil:
		m.log.Info("tombstone destroyed", "volume_id", id, "dataset", fs)
	case !errors.Is(err, zfs.ErrHasDependents) && !errors.Is(err, zfs.ErrNotFound):
		m.log.Warn("destroying tombstone failed", "volume_id", id, "dataset", fs, "error", err)
	}
}

// Expand raises a volume's quota to at least required bytes.
func (m *Manager) Expand(ctx context.Context, id string, required, limit uint64) (uint64, error) {
	unlock, err := m.lock(ctx, id, "expand")
	if err != nil {
		return 0, err
	}
	defer unlock()
	v, err := m.get(ctx, id)
	if err != nil {
		return 0, err
	}
	quota, err := ResolveQuota(&m.cfg, required, limit)
	if err != nil {
		return 0, err
	}
	if quota <= v.Capacity {
		return v.Capacity, nil // shrinking is not supported; the volume already satisfies the request
	}
	if err := m.zfs.SetProperties(ctx, v.Dataset, map[string]string{m.cfg.QuotaProperty: strconv.FormatUint(quota, 10)}); err != nil {
		return 0, zfsError(err, "expanding volume "+id)
	}
	m.log.Info("volume expanded", "volume_id", id, "from", v.Capacity, "to", quota)
	return quota, nil
}

// Capacity reports free space and limits for placement.
func (m *Manager) Capacity(ctx context.Context) (Capacity, error) {
	root, err := m.zfs.Get(ctx, m.cfg.RootDataset)
	if err != nil {
		return Capacity{}, zfsError(err, "root dataset "+m.cfg.RootDataset)
	}
	primaries, err := m.primaries(ctx)
	if err != nil {
		return Capacity{}, err
	}
	return Capacity{Available: root.Available, MaxQuota: uint64(m.cfg.MaxQuota), Volumes: len(primaries)}, nil
}

// zfsError classifies a ZFS error for the CSI layer.
func zfsError(err error, what string) error {
	switch {
	case errors.Is(err, zfs.ErrNotFound):
		return fmt.Errorf("%w: %s: %v", errdefs.ErrNotFound, what, err)
	case errors.Is(err, zfs.ErrExists):
		return fmt.Errorf("%w: %s: %v", errdefs.ErrAlreadyExists, what, err)
	case errors.Is(err, zfs.ErrUnavailable):
		return fmt.Errorf("%w: %s: %v", errdefs.ErrUnavailable, what, err)
	case errors.Is(err, zfs.ErrBusy):
		// A dataset that a receive is creating cannot even be opened
		// until the receive ends: a moment's state, worth a retry.
		return fmt.Errorf("%w: %s: %v; retry", errdefs.ErrUnavailable, what, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", what, err)
	}
	var kinds = []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrOutOfRange, errdefs.ErrFailedPrecondition}
	for _, k := range kinds {
		if errors.Is(err, k) {
			return err // already classified by this package
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// isCSISnapshot reports whether ds is a live CSI snapshot (not a private
// clone snapshot, not one waiting for deferred destruction). Its name
// says so: a snapshot ID is the hash of its CSI name. The labels it was
// taken with (PropSnapshotName, PropSourceVolume) stay on the copy where
// it was taken; copies received by replication carry none (zfs send
// without -p sends no properties: docs/replication.md, "CSI snapshots").
func isCSISnapshot(ds zfs.Dataset) bool {
	return ds.Type == zfs.Snapshot && !ds.DeferDestroy && contract.IsSnapshotID(shortName(ds.Name))
}

// snapshotOf reads a CSI snapshot. Its volume is the copy it is on
// (<root>/<id>, or that volume's tombstone or set-aside copy) when it
// carries no label saying so.
func snapshotOf(ds zfs.Dataset) Snapshot {
	source := ds.User[PropSourceVolume]
	if source == "" {
		source = copyIDOf(ds.Name)
	}
	return Snapshot{
		ID:             shortName(ds.Name),
		Name:           ds.User[PropSnapshotName],
		SourceVolumeID: source,
		Dataset:        ds.Name,
		Size:           ds.Referenced,
		Created:        ds.Created,
		GUID:           ds.GUID,
		CreateTXG:      ds.CreateTXG,
	}
}
