package volume

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Encrypted volumes (docs/security.md, "Encrypted volumes"). A volume
// whose encryption property is not off is created as its own encryption
// root with a passphrase that is never stored on a node: it comes with
// each create and stage, from the call's secrets or the operator's key
// file.
//
// The rule: a copy's key is loaded on a node only while the copy is
// staged there (mounted at a staging path), or for the moment a create
// or a stage holds the copy's lock and needs it. Every change keeps it:
//   - a create unloads the key zfs create loaded before it answers,
//     whether it succeeds or fails, and a create that finds the volume
//     (a retry) checks the passphrase it was given, then unloads a key an
//     interrupted create left loaded, unless the volume is staged here;
//   - a stage checks the passphrase it was given against the key even
//     when the key is loaded (OpenKey), loads it before the mount and
//     unloads it again when the mount fails; an unstage unloads it after
//     the unmount, unless another staging path on the node still mounts
//     the volume;
//   - a fence, a demotion, a receive into a replica, a deletion and a
//     replica's removal unload the key of the copy they change
//     (dropKey): none of them leaves a copy that is staged;
//   - what a crash left loaded anyway is unloaded by the sweep at the
//     node's start and after each listing of the node's copies
//     (SweepKeys).
// Replicas are received raw and never loaded, so a node that only holds
// a replica never sees the plaintext; restores and clones are raw copies
// (copyEncrypted), so staging one loads only its own key.

// Passphrase bounds: OpenZFS takes 8 to 512 bytes.
const (
	minPassphrase = 8
	maxPassphrase = 512
)

// encryptionAsked reports whether the properties a create resolved ask
// for an encrypted volume.
func encryptionAsked(props map[string]string) bool {
	enc, ok := props["encryption"]
	return ok && enc != "off"
}

// passphrase returns the key of an encrypted volume: the one a call's
// secrets carried, or else the operator's key file. It says where the
// key came from, for errors.
func (m *Manager) passphrase(id string, given contract.Passphrase) (contract.Passphrase, string, error) {
	from := fmt.Sprintf("the secret %s", contract.SecretEncryptionKey)
	key := given
	if key == nil && m.cfg.EncryptionKeyFile != "" {
		from = "the key file " + m.cfg.EncryptionKeyFile
		b, err := os.ReadFile(m.cfg.EncryptionKeyFile)
		if err != nil {
			return nil, from, fmt.Errorf("%w: volume %s is encrypted and its key is to come from %s, which cannot be read: %v", errdefs.ErrFailedPrecondition, id, from, err)
		}
		key = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	}
	if key == nil {
		return nil, from, fmt.Errorf("%w: volume %s is encrypted, but the call's secrets carry no %s and node %s names no encryption_key_file; "+
			"give the volume a secrets block with %s (docs/security.md, \"Encrypted volumes\")",
			errdefs.ErrInvalidArgument, id, contract.SecretEncryptionKey, m.cfg.NodeID, contract.SecretEncryptionKey)
	}
	if len(key) < minPassphrase || len(key) > maxPassphrase || bytes.ContainsAny(key, "\r\n") {
		return nil, from, fmt.Errorf("%w: volume %s: the passphrase in %s must be %d to %d bytes on one line (it has %d bytes)",
			errdefs.ErrInvalidArgument, id, from, minPassphrase, maxPassphrase, len(key))
	}
	return key, from, nil
}

// createEncrypted creates an encrypted volume's dataset with its key
// loaded; Create unloads it (CloseKey) once it has prepared the root.
// The operator's key derivation iterations, if set, are fixed then: raw
// sends carry them to every copy.
func (m *Manager) createEncrypted(ctx context.Context, id, dataset string, props map[string]string, given contract.Passphrase) error {
	if m.host.Encryption == nil {
		return fmt.Errorf("%w: node %s cannot create encrypted volumes (no key support); create the volume with encryption=off", errdefs.ErrFailedPrecondition, m.cfg.NodeID)
	}
	key, _, err := m.passphrase(id, given)
	if err != nil {
		return err
	}
	if n := m.cfg.EncryptionPBKDF2Iterations; n > 0 {
		props = maps.Clone(props)
		props["pbkdf2iters"] = strconv.FormatInt(n, 10)
	}
	return m.host.Encryption.CreateEncrypted(ctx, dataset, props, key)
}

// copyEncrypted makes dataset a raw copy of an encrypted snapshot: a
// clone would share the snapshot's encryption root, so staging it would
// load the key of the source volume (or of a replica) on this node.
func (m *Manager) copyEncrypted(ctx context.Context, snapshot, dataset string, props map[string]string) error {
	if m.host.Encryption == nil {
		return fmt.Errorf("%w: node %s cannot copy encrypted volumes (no key support)", errdefs.ErrFailedPrecondition, m.cfg.NodeID)
	}
	return m.host.Encryption.CopyEncrypted(ctx, snapshot, dataset, props)
}

// dropCopiedSnapshot destroys the snapshot a raw copy received along
// with an encrypted volume made from a snapshot or volume, or a restore
// along with a volume made from a backup, which CopyEncrypted and the
// restore destroy at once: a create that stopped in between left it,
// and its retry comes here. Left alone, a restore's would pass for a
// second copy of its source's CSI snapshot.
func (m *Manager) dropCopiedSnapshot(ctx context.Context, v Volume) error {
	snap := ""
	id, fromSnapshot := strings.CutPrefix(v.Source, "snapshot:")
	ref, fromBackup := contract.ParseBackupID(id)
	switch {
	case fromSnapshot && fromBackup:
		// A restore receives the backup's snapshot, encrypted or not.
		snap = v.Dataset + "@" + ref.Snapshot
	case !v.Encrypted || !v.KeyRoot:
		return nil
	case fromSnapshot:
		snap = v.Dataset + "@" + id
	case strings.HasPrefix(v.Source, "volume:"):
		snap = v.Dataset + "@clone-" + shortName(v.Dataset)
	default:
		return nil
	}
	switch err := m.zfs.Destroy(ctx, snap); {
	case err == nil:
		m.log.Info("destroyed the snapshot a copy brought along, left by a create that stopped half-way", "volume_id", v.ID, "snapshot", snap)
	case !errors.Is(err, zfs.ErrNotFound):
		return zfsError(err, "destroying the snapshot the copy of volume "+v.ID+" brought along")
	}
	return nil
}

func encryptionWord(encrypted bool) string {
	if encrypted {
		return "encrypted"
	}
	return "not encrypted"
}

// OpenKey loads the key of volume v's copy, which the caller has locked
// for staging (Stageable), from given (a stage's secrets) or the key
// file. A copy that is not encrypted needs nothing. The passphrase is
// checked whether or not the key is loaded already (as by a staging at
// another path, or by anything else): a loaded key says nothing about
// the caller, so a stage without the volume's passphrase is refused
// either way. A wrong or missing key changes nothing and is
// InvalidArgument. opened tells whether this call loaded the key: a
// stage whose mount then fails unloads it again.
func (m *Manager) OpenKey(ctx context.Context, v Volume, given contract.Passphrase) (opened bool, err error) {
	if !v.Encrypted {
		return false, nil
	}
	if !v.KeyRoot {
		if v.KeyLoaded {
			return false, nil // the operator's key of a dataset above: not the driver's to check
		}
		return false, fmt.Errorf("%w: volume %s is encrypted with the key of a dataset above it, which is not loaded; the operator loads it (zfs load-key)", errdefs.ErrFailedPrecondition, v.ID)
	}
	if m.host.Encryption == nil {
		return false, fmt.Errorf("%w: node %s cannot load the keys of encrypted volumes", errdefs.ErrFailedPrecondition, m.cfg.NodeID)
	}
	key, from, err := m.passphrase(v.ID, given)
	if err != nil {
		return false, err
	}
	if v.KeyLoaded {
		if err := m.host.Encryption.CheckKey(ctx, v.Dataset, key); err != nil {
			return false, keyError(err, v.ID, from, "nothing was mounted")
		}
		return false, nil
	}
	if err := m.host.Encryption.LoadKey(ctx, v.Dataset, key); err != nil {
		return false, keyError(err, v.ID, from, "nothing was mounted")
	}
	m.log.Info("volume key loaded", "volume_id", v.ID, "from", from)
	return true, nil
}

// checkCreateKey checks the passphrase a create gave (or the key file)
// against the key of the volume it found, v, loaded or not: the retry
// of a create answers the volume only to a caller who knows its key, as
// the first create did.
func (m *Manager) checkCreateKey(ctx context.Context, v Volume, given contract.Passphrase) error {
	if m.host.Encryption == nil {
		return fmt.Errorf("%w: node %s cannot check the keys of encrypted volumes", errdefs.ErrFailedPrecondition, m.cfg.NodeID)
	}
	key, from, err := m.passphrase(v.ID, given)
	if err != nil {
		return err
	}
	if err := m.host.Encryption.CheckKey(ctx, v.Dataset, key); err != nil {
		return keyError(err, v.ID, from, "the volume exists with another passphrase, and this create changed nothing")
	}
	return nil
}

// keyError classifies an error of a key's load or check: a wrong key is
// InvalidArgument (the call's secrets carry a value that does not fit;
// CSI's PermissionDenied is for an identity the secrets name, which a
// passphrase is not), saying where the key came from and what happened.
func keyError(err error, id, from, outcome string) error {
	if errors.Is(err, zfs.ErrWrongKey) {
		return fmt.Errorf("%w: volume %s: the passphrase from %s does not unlock it; %s. Give the volume's secrets the passphrase it was created with",
			errdefs.ErrInvalidArgument, id, from, outcome)
	}
	return zfsError(err, "checking the key of volume "+id)
}

// CloseKey unloads the key of volume id's copy, if it is its own
// encryption root and the key is loaded, unless the copy is staged on
// this node (mounted: Nomad stages a volume once per access mode, and
// the last unstage unloads the key). ErrBusy (mounted where the node
// does not see it) comes back as FailedPrecondition.
func (m *Manager) CloseKey(ctx context.Context, id string) error {
	ds, err := m.zfs.Get(ctx, datasetFor(m.cfg.RootDataset, id))
	switch {
	case errors.Is(err, zfs.ErrNotFound):
		return nil
	case err != nil:
		return zfsError(err, "volume "+id)
	}
	return m.closeKey(ctx, id, ds)
}

func (m *Manager) closeKey(ctx context.Context, id string, ds zfs.Dataset) error {
	if !ds.Encrypted || !ds.KeyRoot || !ds.KeyLoaded || m.host.Encryption == nil {
		return nil
	}
	if m.host.Mounted != nil {
		// Staged at another path too (Nomad stages per access mode):
		// the last unstage unloads the key.
		if mounted, err := m.host.Mounted(ds.Name); err == nil && mounted {
			m.log.Debug("volume still mounted: its key stays loaded", "volume_id", id)
			return nil
		}
	}
	if err := m.host.Encryption.UnloadKey(ctx, ds.Name); err != nil {
		if errors.Is(err, zfs.ErrBusy) {
			return fmt.Errorf("%w: the key of volume %s stays loaded: %s is still mounted on node %s (%v)", errdefs.ErrFailedPrecondition, id, ds.Name, m.cfg.NodeID, err)
		}
		return zfsError(err, "unloading the key of volume "+id)
	}
	m.log.Info("volume key unloaded", "volume_id", id, "dataset", ds.Name)
	return nil
}

// dropKey unloads the key of the copy at dataset (of volume id), which
// the caller holds the lock of and is making a copy that is not staged:
// fenced, a replica, set aside, a tombstone. The change goes on whatever
// happens to the key, so a failure is logged, and the sweeps
// (SweepKeys) try again.
func (m *Manager) dropKey(ctx context.Context, id, dataset, why string) {
	if m.host.Encryption == nil {
		return
	}
	ds, err := m.zfs.Get(ctx, dataset)
	if err == nil {
		err = m.closeKey(ctx, id, ds)
	}
	if err != nil && !errors.Is(err, zfs.ErrNotFound) {
		m.log.Warn("the key of a copy that is not staged stays loaded; the node's next sweep tries again", "volume_id", id, "dataset", dataset, "why", why, "error", err)
	}
}

// SweepKeys unloads the key of every encrypted copy under the node's
// root that is not staged here: the keys a crash left loaded (between a
// create's zfs create and its unload, between a stage's load and its
// mount, between an unmount and the unload). zfs-node runs it at its
// start, before it serves any call; each listing of the node's copies
// runs it too (sweepKeysOf). It needs to know what is mounted: without
// Mounted it unloads nothing.
func (m *Manager) SweepKeys(ctx context.Context) error {
	if m.host.Encryption == nil || m.host.Mounted == nil {
		return nil
	}
	children, err := m.zfs.Children(ctx, m.cfg.RootDataset)
	if err != nil {
		return zfsError(err, "listing the node's copies for their keys")
	}
	m.sweepKeys(ctx, loadedKeys(children))
	return nil
}

// loadedKeys returns the datasets among the children of the node's root
// that are encryption roots with their key loaded.
func loadedKeys(children []zfs.Dataset) []string {
	var out []string
	for _, ds := range children {
		if ds.Type == zfs.Filesystem && ds.Encrypted && ds.KeyRoot && ds.KeyLoaded {
			out = append(out, ds.Name)
		}
	}
	return out
}

// sweepKeys unloads the keys of datasets, each under its copy's lock
// (a stage loads a key and mounts under it, so a copy found unmounted
// with its key loaded under the lock is staged nowhere) unless it is
// mounted here. Best effort: each failure is logged and the next sweep
// tries again.
func (m *Manager) sweepKeys(ctx context.Context, datasets []string) {
	for _, fs := range datasets {
		if mounted, err := m.mounted(fs); err != nil || mounted {
			continue // staged here (or the mount table cannot tell): left to the unstage
		}
		m.sweepKey(ctx, fs)
	}
}

func (m *Manager) sweepKey(ctx context.Context, fs string) {
	id := copyIDOfDataset(fs)
	unlock, err := m.lock(ctx, id, "unloading a key left loaded")
	if err != nil {
		m.log.Warn("the key of a copy that is not staged stays loaded until the next sweep: its lock is busy", "volume_id", id, "dataset", fs, "error", err)
		return
	}
	defer unlock()
	ds, err := m.zfs.Get(ctx, fs)
	if err != nil || !ds.KeyLoaded {
		return // gone, or unloaded meanwhile
	}
	if mounted, err := m.mounted(fs); err != nil || mounted {
		return // staged meanwhile
	}
	m.log.Warn("unloading the key of a copy that is not staged on this node, left loaded by a crash or a failed step", "volume_id", id, "dataset", fs, "role", ds.User[copyrecord.PropRole])
	if err := m.closeKey(ctx, id, ds); err != nil {
		m.log.Warn("the key of a copy that is not staged stays loaded until the next sweep", "volume_id", id, "dataset", fs, "error", err)
	}
}
