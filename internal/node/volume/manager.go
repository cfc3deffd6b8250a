// Package volume is the node's volume logic: CSI volumes and snapshots as
// ZFS datasets under the operator's root dataset, named by IDs derived from
// their CSI names and labelled with the driver's user properties.
//
// The node agent service (for the controller) and the CSI node service both
// call the Manager; neither touches ZFS directly. The Manager also keeps
// the node's indexes of its copies, which the replication receiver tells
// of every receive, and deletes replicas under their locks (what a
// removal does on disk is copyrecord.Replicas'). Records keeps the node's
// promise and deleted-snapshot records, which outlive its copies; the
// Manager reads them where a change of a copy must agree with them.
// Rules (docs/volumes.md):
//   - every volume is <root>/<volume id>, mountpoint=legacy, mounted only by
//     the CSI node service;
//   - a CSI snapshot is <root>/<volume id>@<snapshot id>;
//   - snapshots are independent of their volume: deleting a volume that has
//     snapshots turns it into a hidden tombstone, destroyed with its last
//     snapshot;
//   - clones stay valid after their origin is deleted: an origin snapshot
//     with clones is destroyed deferred (zfs destroy -d) and vanishes with
//     its last clone.
//
// The driver's words (generation, promise, fence, tombstone, set aside,
// ...) are defined in docs/glossary.md.
package volume

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/volumelog"
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
	// OwnerDigest is the owner secret's digest of the copy the snapshot
	// is on (contract.ParamOwnerDigest), read by GetSnapshot only.
	OwnerDigest string
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

// Restorer receives the backup ref, fetched with grant, into dataset with
// props set by the receive; check sees the backup's header first and may
// refuse it.
type Restorer func(ctx context.Context, ref contract.BackupRef, grant, dataset string, props map[string]string,
	check func(encrypted bool, referenced uint64) error) error

// Host is what the node's host gives the Manager besides the pool. Each
// part may be nil, with the effect its comment says.
type Host struct {
	// Mounted reports whether a dataset is mounted on this node; a
	// mounted primary is never fenced or demoted. Nil: nothing is.
	Mounted func(dataset string) (bool, error)
	// MountHolders names the processes in other mount namespaces that
	// see a dataset mounted (mount.Holders): a delete is refused before
	// it touches anything while any holds the volume, and says who does.
	MountHolders func(dataset string) []string
	// Roots sets the owner and mode of new volumes' root directories;
	// nil: a create that asks for them fails.
	Roots RootPreparer
	// Encryption creates and copies encrypted volumes and loads and
	// unloads their keys (keys.go); nil: a create that asks for
	// encryption fails.
	Encryption zfs.Encryption
}

// Pool is what the Manager needs of the node's pool (a part of
// zfs.Interface).
type Pool interface {
	zfs.DatasetManager
	zfs.Pools
	// Holds and the snapshots in creation order: a promotion holds its
	// newest snapshot as the move's source's base (promote).
	zfs.Holds
	zfs.SnapshotLister
	// Properties reads properties of one dataset as zfs get -Hp prints
	// them, in one open: the Manager reads written@snapshot (Copy).
	Properties(ctx context.Context, dataset string, props ...string) (map[string]string, error)
}

// Deps are what a Manager is built from: ZFS, Config and Log are
// required, the rest may be nil.
type Deps struct {
	ZFS    Pool
	Config config.Node
	Log    hclog.Logger
	// Replicas reads and removes the node's replicas over the same pool;
	// nil on a node without replication, which holds none.
	Replicas *copyrecord.Replicas
	// Locks is the one lock of each copy on the node, which the
	// replication pusher and receiver share; nil: the Manager's own.
	Locks *copylock.Locks
	Host  Host
	// Restore receives a backup from a backup target into a new volume's
	// dataset (replication.Pusher.Restore); nil: a create from a backup
	// fails.
	Restore Restorer
}

// Manager runs volume operations on one node. Operations on one volume are
// serialised; different volumes proceed in parallel as far as ZFS allows.
type Manager struct {
	host    Host
	restore Restorer

	zfs Pool
	// replicas reads and removes the node's replicas (replicas.go); nil
	// on a node built without replication, which holds none.
	replicas *copyrecord.Replicas
	cfg      config.Node
	log      hclog.Logger
	locks    *copylock.Locks
	// records are the node's promises and deleted-snapshot records
	// (Records).
	records *Records
	// fences are the lease's on the primaries (lease.go).
	fences *Fences
	clock  func() time.Time // now reads it (UseClock)
	// index is the node's index of its primaries and CSI snapshots,
	// which every change of them updates (index.go).
	index *Index
	// sweeping tells whether what a listing found (tombstones, keys left
	// loaded) is being seen to (sweepListed).
	sweepMu  sync.Mutex
	sweeping bool
	// awaited: the stages waiting for a promotion (awaited.go).
	awaited awaitedPromotions
}

// NewManager returns the Manager of the node d.Config describes.
func NewManager(d Deps) *Manager {
	m := &Manager{zfs: d.ZFS, replicas: d.Replicas, cfg: d.Config, log: d.Log, host: d.Host, restore: d.Restore,
		clock: time.Now, locks: d.Locks}
	if m.locks == nil {
		m.locks = new(copylock.Locks)
	}
	m.records = NewRecords(d.ZFS, d.Config, d.Log)
	m.index = newIndex(m, d.ZFS, d.Config.RootDataset, d.Log)
	m.fences = newFences(m, m.records, m.index, d.ZFS, d.Config.NodeID, d.Log)
	return m
}

// Records are the node's promise and deleted-snapshot records, which the
// Manager reads where a change of a copy must agree with them.
func (m *Manager) Records() *Records { return m.records }

// Fences are the lease's fences on the node's primaries, which the
// Manager asks before it stages or unfences one.
func (m *Manager) Fences() *Fences { return m.fences }

// Index is the node's index of its primaries and CSI snapshots: the
// volumes version, what changed since one, and pages of either.
func (m *Manager) Index() *Index { return m.index }

// UseClock sets the node's wall clock (time.Now by default), which names
// set-aside copies and dates fences: the simulation skews it per node.
// No decision compares two nodes' readings of it (docs/safety.md).
func (m *Manager) UseClock(now func() time.Time) { m.clock = now }

// now is the node's wall clock, which Fences and Index read too.
func (m *Manager) now() time.Time { return m.clock() }

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
	case ds.User[copyrecord.PropVolumeID] == id && ds.User[copyrecord.PropRole] == contract.RoleReplica:
		// The operator's commands ask every node: a replica is no mystery.
		return Volume{}, fmt.Errorf("%w: node %s holds a replica of volume %s, not its primary", errdefs.ErrFailedPrecondition, m.cfg.NodeID, id)
	}
	return Volume{}, fmt.Errorf("%w: dataset %s exists but is not a volume of this driver (role %q); an operator must look at it",
		errdefs.ErrFailedPrecondition, ds.Name, ds.User[copyrecord.PropRole])
}

// volumeOf reads a volume from its dataset; ok is false for anything that is
// not a live primary volume.
func (m *Manager) volumeOf(ds zfs.Dataset) (Volume, bool) {
	id := ds.User[copyrecord.PropVolumeID]
	if ds.Type != zfs.Filesystem || ds.User[copyrecord.PropRole] != contract.RolePrimary || id != shortName(ds.Name) || zfs.Parent(ds.Name) != m.cfg.RootDataset {
		return Volume{}, false
	}
	capacity := ds.RefQuota
	if m.cfg.QuotaProperty == "quota" {
		capacity = ds.Quota
	}
	gen, _ := strconv.ParseUint(ds.User[copyrecord.PropGeneration], 10, 64)
	volumelog.Learn(id, ds.User[copyrecord.PropName])
	return Volume{
		ID:            id,
		Name:          ds.User[copyrecord.PropName],
		Dataset:       ds.Name,
		Capacity:      capacity,
		Used:          ds.Referenced,
		Parameters:    copyrecord.DecodeParameters(ds.User[copyrecord.PropParameters]),
		Source:        ds.User[copyrecord.PropSource],
		Generation:    gen,
		Created:       ds.Created,
		MovingTo:      movingTo(ds),
		FencedAt:      fencedAt(ds),
		FailoverFrom:  ds.User[copyrecord.PropFailoverLag],
		LeaseFencedAt: leaseFencedAt(ds.User[copyrecord.PropLeaseFenced]),
		SupersededBy:  supersededBy(ds.User[copyrecord.PropSuperseded]),
		Forced:        ds.User[copyrecord.PropForced] != "" && ds.User[copyrecord.PropForced] == ds.User[copyrecord.PropGeneration],
		RootPending:   ds.User[copyrecord.PropRootPending] != "",
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

// listPrimaries lists the node's primaries for their index (Index). The
// same listing finds the node's tombstones and the copies whose key is
// loaded, which are seen to apart (sweepListed: tombstones collected,
// keys of copies not staged unloaded): one listing of the node instead
// of several, each taking seconds at a thousand volumes.
func (m *Manager) listPrimaries(ctx context.Context) ([]Volume, error) {
	children, err := m.zfs.Children(ctx, m.cfg.RootDataset)
	if err != nil {
		return nil, zfsError(err, "listing volumes")
	}
	m.sweepListed(tombstonesAmong(children), loadedKeys(children))
	return m.volumesAmong(children), nil
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
	primaries, err := m.index.primaries(ctx)
	if err != nil {
		return Capacity{}, err
	}
	return Capacity{Available: root.Available, MaxQuota: uint64(m.cfg.MaxQuota), Volumes: len(primaries)}, nil
}

// RootSpace reads the root dataset's used and available bytes: what its
// volumes, replicas and snapshots take, and what is left to them (the
// pool's free space, bounded by the root's quota).
func (m *Manager) RootSpace(ctx context.Context) (used, available uint64, err error) {
	root, err := m.zfs.Get(ctx, m.cfg.RootDataset)
	if err != nil {
		return 0, 0, zfsError(err, "root dataset "+m.cfg.RootDataset)
	}
	return root.Used, root.Available, nil
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
	source := ds.User[copyrecord.PropSourceVolume]
	if source == "" {
		source = copyIDOf(ds.Name)
	}
	return Snapshot{
		ID:             shortName(ds.Name),
		Name:           ds.User[copyrecord.PropSnapshotName],
		SourceVolumeID: source,
		Dataset:        ds.Name,
		Size:           ds.Referenced,
		Created:        ds.Created,
		GUID:           ds.GUID,
		CreateTXG:      ds.CreateTXG,
	}
}
