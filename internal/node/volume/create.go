package volume

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/volumelog"
)

// Create creates a volume, or returns the one an earlier identical request
// created. A request that differs from the existing volume of the same name
// fails with ErrAlreadyExists.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Volume, error) {
	spec, err := m.resolveCreate(req)
	if err != nil {
		return Volume{}, err
	}
	id := contract.VolumeIDForName(req.Name)
	volumelog.Learn(id, req.Name)
	unlock, err := m.lock(ctx, id, "create")
	if err != nil {
		return Volume{}, err
	}
	defer unlock()
	// Whether it is a primary may change: the index reads it again.
	defer m.index.reindex(ctx, id)

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
	// Only a create: a promotion resolves a volume's parameters again,
	// and volumes made before the operator required owners keep moving.
	if _, owned := spec.recorded[contract.ParamOwnerDigest]; m.cfg.RequireOwnerSecret && !owned {
		return spec, fmt.Errorf("%w: this cluster requires every volume to have an owner secret (require_owner_secret): add secrets { %s = \"...\" } to the volume spec, at least %d random characters", errdefs.ErrInvalidArgument, contract.SecretOwner, contract.MinOwnerSecretLength)
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
// create left undone. A volume created with a key answers only a request
// with its passphrase, as the first create did; and whatever the retry
// finds, the key an interrupted create left loaded is unloaded, unless
// the volume is staged here (closeCreated).
func (m *Manager) createAgain(ctx context.Context, existing Volume, req CreateRequest, spec createSpec) (Volume, error) {
	log := m.log.With("volume_id", existing.ID)
	if err := compatible(existing, req.Name, spec.quota, req.LimitBytes, spec.recorded, spec.source); err != nil {
		return Volume{}, err
	}
	err := m.finishAgain(ctx, existing, req, spec)
	v, err := m.closeCreated(ctx, existing, err)
	if err != nil {
		return Volume{}, err
	}
	log.Debug("volume exists; create is a no-op")
	return v, nil
}

// finishAgain checks a repeated create's key and finishes what the first
// one left undone: the root directory, a raw copy's snapshot.
func (m *Manager) finishAgain(ctx context.Context, existing Volume, req CreateRequest, spec createSpec) error {
	if existing.RootPending {
		// finishRoot checks the key as it loads it (OpenKey).
		m.log.Info("finishing the root directory of a create that stopped half-way", "volume_id", existing.ID, "root", spec.root.String())
		return m.finishRoot(ctx, existing, spec.root, req.Passphrase)
	}
	// A volume made with a key (not a raw copy of a snapshot or volume,
	// whose create takes none) answers only its key.
	if existing.Encrypted && existing.KeyRoot && existing.Source == "" {
		if err := m.checkCreateKey(ctx, existing, req.Passphrase); err != nil {
			return err
		}
	}
	return m.dropCopiedSnapshot(ctx, existing)
}

// closeCreated ends a create of volume v, new or repeated, whose outcome
// is err: the key zfs create loaded, or an interrupted create left
// loaded, is unloaded whether the create succeeded or not, unless the
// volume is staged on this node (CloseKey): a volume's key is loaded only
// while it is staged (keys.go). It returns the volume as it is then,
// read again when the create changed it (its key, its root).
func (m *Manager) closeCreated(ctx context.Context, v Volume, err error) (Volume, error) {
	changed := v.RootPending // finishRoot ran, and may have loaded the key
	if v.Encrypted && (v.KeyLoaded || changed) {
		changed = true
		if err != nil {
			m.closeFailedCreate(ctx, v.ID, err)
			return Volume{}, err
		}
		if err := m.CloseKey(ctx, v.ID); err != nil {
			return Volume{}, err
		}
	}
	switch {
	case err != nil:
		return Volume{}, err
	case changed:
		return m.get(ctx, v.ID)
	}
	return v, nil
}

// closeFailedCreate unloads the key of volume id after its create failed
// with err, unless the volume is staged here; a failure of the unload is
// logged, and the create's retry or the node's sweep unloads it.
func (m *Manager) closeFailedCreate(ctx context.Context, id string, err error) {
	if cerr := m.CloseKey(ctx, id); cerr != nil {
		m.log.Warn("the key of a create that failed stays loaded; the create's retry or the node's sweep unloads it", "volume_id", id, "create_error", err, "error", cerr)
	}
}

// createNew creates volume id's dataset, sets its root directory and
// leaves its key unloaded.
func (m *Manager) createNew(ctx context.Context, id string, req CreateRequest, spec createSpec) (Volume, error) {
	props := spec.props
	props[m.cfg.QuotaProperty] = strconv.FormatUint(spec.quota, 10)
	props["mountpoint"] = "legacy"
	props[copyrecord.PropVolumeID] = id
	props[copyrecord.PropName] = req.Name
	props[copyrecord.PropRole] = contract.RolePrimary
	props[copyrecord.PropParameters] = copyrecord.EncodeParameters(spec.recorded)
	props[copyrecord.PropSource] = spec.source
	if spec.setRoot {
		if m.host.Roots == nil {
			return Volume{}, fmt.Errorf("%w: this node cannot set a volume's root directory owner or mode; create the volume without uid, gid and mode", errdefs.ErrFailedPrecondition)
		}
		props[copyrecord.PropRootPending] = "true"
	}
	dataset := datasetFor(m.cfg.RootDataset, id)
	generation, err := m.createPromised(ctx, req, id, dataset, spec.quota, props)
	if err != nil {
		// zfs create may have made the dataset, with its key loaded,
		// before the create failed.
		m.closeFailedCreate(ctx, id, err)
		return Volume{}, err
	}
	m.fences.Confirm(id, generation) // a majority promised it to this node first
	v, err := m.get(ctx, id)
	if err != nil {
		m.closeFailedCreate(ctx, id, err)
		return Volume{}, err
	}
	switch {
	case !spec.setRoot:
	case v.KeyLoaded:
		// zfs create loaded the key from this request's passphrase:
		// nothing to check.
		err = m.prepareRoot(ctx, v.Dataset, spec.root)
	default:
		err = m.finishRoot(ctx, v, spec.root, req.Passphrase)
	}
	if v, err = m.closeCreated(ctx, v, err); err != nil {
		return Volume{}, err
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
	unlock, err := m.records.lockPromise(ctx, id)
	if err != nil {
		return 0, err
	}
	defer unlock()
	p, err := m.records.Promised(ctx, id)
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
	props[copyrecord.PropGeneration] = strconv.FormatUint(generation, 10)
	props[copyrecord.PropHistoryFrom] = strconv.FormatUint(generation, 10)
	switch ref, fromBackup := contract.ParseBackupID(req.SourceSnapshotID); {
	case fromBackup:
		err = m.restoreBackup(ctx, ref, req.RestoreGrant, dataset, quota, props, req.Parameters)
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
	case !contract.SameOwner(v.Parameters, params):
		// Most likely a volume of the same name in another Nomad
		// namespace: Nomad sends no namespace (docs/volumes.md).
		return fmt.Errorf("%w: volume %q %s: it may be another Nomad namespace's volume of the same name; choose a name no other namespace uses, or present the %s it was created with",
			errdefs.ErrAlreadyExists, name, contract.OwnerMismatch(v.Parameters, params), contract.SecretOwner)
	case copyrecord.EncodeParameters(v.Parameters) != copyrecord.EncodeParameters(params):
		return fmt.Errorf("%w: volume %q exists with parameters %s, not %s", errdefs.ErrAlreadyExists, name,
			copyrecord.EncodeParameters(contract.WithoutOwner(v.Parameters)), copyrecord.EncodeParameters(contract.WithoutOwner(params)))
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

// restoreBackup makes dataset a new volume from a backup on a target: a
// receive of its whole stream with props (raw for an encrypted volume,
// which keeps its encryption and its passphrase, as a copy of an
// encrypted snapshot does). A backup that holds more than quota, or
// whose encryption the parameters contradict, is refused before
// anything is received.
func (m *Manager) restoreBackup(ctx context.Context, ref contract.BackupRef, grant, dataset string, quota uint64, props, params map[string]string) error {
	if m.restore == nil {
		return fmt.Errorf("%w: node %s restores no backups (no backup_targets)", errdefs.ErrFailedPrecondition, m.cfg.NodeID)
	}
	props = maps.Clone(props)
	delete(props, "encryption") // the backup's own applies
	check := func(encrypted bool, referenced uint64) error {
		if referenced > quota {
			return fmt.Errorf("%w: backup %s holds %d bytes, more than the requested capacity %d", errdefs.ErrOutOfRange, ref.SnapshotID(), referenced, quota)
		}
		return keepsEncryption(ref.SnapshotID(), encrypted, params)
	}
	return m.restore(ctx, ref, grant, dataset, props, check)
}

// keepsEncryption refuses parameters that ask a volume made from source
// (a snapshot, a volume or a backup), whose encryption it keeps, for the
// other.
func keepsEncryption(source string, encrypted bool, params map[string]string) error {
	if asked, ok := params["encryption"]; ok && (asked != "off") != encrypted {
		return fmt.Errorf("%w: a volume made from %s keeps its encryption (%s), and cannot have encryption=%s; leave encryption out of its parameters",
			errdefs.ErrInvalidArgument, source, encryptionWord(encrypted), asked)
	}
	return nil
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
	if err := contract.CheckSameOwner(snapshot, copyrecord.DecodeParameters(fs.User[copyrecord.PropParameters]), params); err != nil {
		return err
	}
	props = maps.Clone(props)
	delete(props, "encryption") // the operator's default does not apply
	if err := keepsEncryption(snapshot, fs.Encrypted, params); err != nil {
		return err
	}
	if fs.Encrypted && fs.KeyRoot {
		return m.copyEncrypted(ctx, snapshot, dataset, props)
	}
	// Not encrypted, or with the key of the root dataset (the operator
	// loads it): a clone opens as its source does.
	return m.zfs.Clone(ctx, snapshot, dataset, props)
}
