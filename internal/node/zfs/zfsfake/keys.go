package zfsfake

import (
	"context"
	"fmt"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

var _ zfs.Encryption = (*Fake)(nil)

// CreateEncrypted creates an encryption root with its key loaded.
func (f *Fake) CreateEncrypted(ctx context.Context, name string, props map[string]string, passphrase []byte) error {
	unlock, err := f.enter("create", name)
	if err != nil {
		return err
	}
	defer unlock()
	if strings.Contains(name, "@") {
		return fmt.Errorf("create %s: a snapshot name", name)
	}
	if len(passphrase) < 8 {
		return fmt.Errorf("create %s: passphrase too short (min 8)", name)
	}
	if err := f.create(name, zfs.Filesystem, "", props); err != nil {
		return err
	}
	e := f.datasets[name]
	if e.props["encryption"] == "" || e.props["encryption"] == "off" {
		e.props["encryption"] = "on"
	}
	e.passphrase, e.keyLoaded = string(passphrase), true
	return nil
}

// CopyEncrypted makes target a copy of the encrypted snapshot with the
// same key, its own encryption root, key not loaded.
func (f *Fake) CopyEncrypted(ctx context.Context, snapshot, target string, props map[string]string) error {
	unlock, err := f.enter("receive", target)
	if err != nil {
		return err
	}
	defer unlock()
	root := f.encryptionRoot(snapshot)
	if root == nil {
		return fmt.Errorf("zfs send -w %s: not an encrypted snapshot", snapshot)
	}
	e, err := f.createFrom(snapshot, target, "", props)
	if err != nil {
		return err
	}
	e.props["encryption"], e.passphrase, e.keyLoaded = root.props["encryption"], root.passphrase, false
	e.ds.Referenced = f.datasets[snapshot].ds.Referenced
	return nil
}

// LoadKey loads the key of encryption root fs.
func (f *Fake) LoadKey(ctx context.Context, fs string, passphrase []byte) error {
	return f.onEncryptionRoot("load-key", fs, func(e *entry) error {
		if e.passphrase != string(passphrase) {
			return fmt.Errorf("zfs load-key %s: Incorrect key provided: %w", fs, zfs.ErrWrongKey)
		}
		e.keyLoaded = true
		return nil
	})
}

// UnloadKey unloads the key of encryption root fs.
func (f *Fake) UnloadKey(ctx context.Context, fs string) error {
	return f.onEncryptionRoot("unload-key", fs, func(e *entry) error {
		e.keyLoaded = false
		return nil
	})
}

func (f *Fake) onEncryptionRoot(op, fs string, fn func(e *entry) error) error {
	return f.onDataset(op, fs, func(e *entry) error {
		if root := f.encryptionRoot(fs); root != e {
			return fmt.Errorf("zfs %s %s: not an encryption root", op, fs)
		}
		return fn(e)
	})
}

// encryptionRoot returns the entry whose key opens dataset name: the
// nearest encrypted ancestor (name itself included, a snapshot's
// filesystem for a snapshot, a clone's origin for a clone that is not a
// root itself); nil when name is not encrypted.
func (f *Fake) encryptionRoot(name string) *entry {
	for n := name; n != ""; n = zfs.Parent(n) {
		e := f.datasets[n]
		switch {
		case e == nil:
			return nil
		case e.props["encryption"] == "off":
			return nil
		case e.passphrase != "" || e.props["encryption"] != "":
			return e
		case e.ds.Origin != "":
			return f.encryptionRoot(e.ds.Origin)
		}
	}
	return nil
}
