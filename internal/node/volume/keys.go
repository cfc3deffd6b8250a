package volume

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Encrypted volumes (docs/security.md, "Encrypted volumes"). A volume
// whose encryption property is not off is created as its own encryption
// root with a passphrase that is never stored on a node: it comes with
// each create and stage, from the call's secrets or the operator's key
// file. The invariant: a copy's key is loaded only while the copy is
// staged on its node, or for the moment a create needs it. Create loads
// it (zfs create does) and unloads it before it returns; a stage loads it
// before the mount and unloads it again when the mount fails; an unstage
// unloads it after the unmount, unless another staging path on the node
// still mounts it. Replicas are received raw and never loaded, so a node
// that only holds a replica never sees the plaintext; restores and
// clones are raw copies (copyEncrypted), so staging one loads only its
// own key.

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
func (m *Manager) createEncrypted(ctx context.Context, id, dataset string, props map[string]string, given contract.Passphrase) error {
	if m.Encryption == nil {
		return fmt.Errorf("%w: node %s cannot create encrypted volumes (no key support); create the volume with encryption=off", errdefs.ErrFailedPrecondition, m.cfg.NodeID)
	}
	key, _, err := m.passphrase(id, given)
	if err != nil {
		return err
	}
	return m.Encryption.CreateEncrypted(ctx, dataset, props, key)
}

// copyEncrypted makes dataset a raw copy of an encrypted snapshot: a
// clone would share the snapshot's encryption root, so staging it would
// load the key of the source volume (or of a replica) on this node.
func (m *Manager) copyEncrypted(ctx context.Context, snapshot, dataset string, props map[string]string) error {
	if m.Encryption == nil {
		return fmt.Errorf("%w: node %s cannot copy encrypted volumes (no key support)", errdefs.ErrFailedPrecondition, m.cfg.NodeID)
	}
	return m.Encryption.CopyEncrypted(ctx, snapshot, dataset, props)
}

// dropCopiedSnapshot destroys the snapshot a raw copy received along
// with an encrypted volume made from a snapshot or volume, which
// CopyEncrypted destroys at once: a create that stopped in between left
// it, and its retry comes here. Left alone, a restore's would pass for a
// second copy of its source's CSI snapshot.
func (m *Manager) dropCopiedSnapshot(ctx context.Context, v Volume) error {
	if !v.Encrypted || !v.KeyRoot {
		return nil
	}
	snap := ""
	if id, ok := strings.CutPrefix(v.Source, "snapshot:"); ok {
		snap = v.Dataset + "@" + id
	} else if strings.HasPrefix(v.Source, "volume:") {
		snap = v.Dataset + "@clone-" + shortName(v.Dataset)
	} else {
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
// file. A copy that is not encrypted, or whose key is loaded already,
// needs nothing. A wrong key changes nothing and is InvalidArgument.
// opened tells whether this call loaded it: a stage whose mount then
// fails unloads it again.
func (m *Manager) OpenKey(ctx context.Context, v Volume, given contract.Passphrase) (opened bool, err error) {
	if !v.Encrypted || v.KeyLoaded {
		return false, nil
	}
	if !v.KeyRoot {
		return false, fmt.Errorf("%w: volume %s is encrypted with the key of a dataset above it, which is not loaded; the operator loads it (zfs load-key)", errdefs.ErrFailedPrecondition, v.ID)
	}
	if m.Encryption == nil {
		return false, fmt.Errorf("%w: node %s cannot load the keys of encrypted volumes", errdefs.ErrFailedPrecondition, m.cfg.NodeID)
	}
	key, from, err := m.passphrase(v.ID, given)
	if err != nil {
		return false, err
	}
	if err := m.Encryption.LoadKey(ctx, v.Dataset, key); err != nil {
		if errors.Is(err, zfs.ErrWrongKey) {
			return false, fmt.Errorf("%w: volume %s: the passphrase from %s does not unlock it; nothing was mounted. Give the volume's secrets the passphrase it was created with",
				errdefs.ErrInvalidArgument, v.ID, from)
		}
		return false, zfsError(err, "loading the key of volume "+v.ID)
	}
	m.log.Info("volume key loaded", "volume_id", v.ID, "from", from)
	return true, nil
}

// CloseKey unloads the key of volume id's copy, if it is its own
// encryption root and the key is loaded. The caller has unmounted it;
// ErrBusy (still mounted somewhere) comes back as FailedPrecondition.
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
	if !ds.Encrypted || !ds.KeyRoot || !ds.KeyLoaded || m.Encryption == nil {
		return nil
	}
	if m.Mounted != nil {
		// Staged at another path too (Nomad stages per access mode):
		// the last unstage unloads the key.
		if mounted, err := m.Mounted(ds.Name); err == nil && mounted {
			m.log.Debug("volume still mounted: its key stays loaded", "volume_id", id)
			return nil
		}
	}
	if err := m.Encryption.UnloadKey(ctx, ds.Name); err != nil {
		if errors.Is(err, zfs.ErrBusy) {
			return fmt.Errorf("%w: the key of volume %s stays loaded: %s is still mounted on node %s (%v)", errdefs.ErrFailedPrecondition, id, ds.Name, m.cfg.NodeID, err)
		}
		return zfsError(err, "unloading the key of volume "+id)
	}
	m.log.Info("volume key unloaded", "volume_id", id)
	return nil
}
