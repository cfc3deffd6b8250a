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

// LoadKey loads the key of encryption root fs. As zfs load-key (and
// zfscmd's LoadKey), a key loaded already is no error and its passphrase
// is not checked: only CheckKey checks a loaded key.
func (f *Fake) LoadKey(ctx context.Context, fs string, passphrase []byte) error {
	return f.onEncryptionRoot("load-key", fs, func(e *entry) error {
		if e.keyLoaded {
			return nil
		}
		if err := checkPassphrase("load-key", fs, e, passphrase); err != nil {
			return err
		}
		e.keyLoaded = true
		return nil
	})
}

// CheckKey checks passphrase against the key of encryption root fs,
// loaded or not, as zfs load-key -n; it changes nothing.
func (f *Fake) CheckKey(ctx context.Context, fs string, passphrase []byte) error {
	return f.onEncryptionRoot("check-key", fs, func(e *entry) error {
		return checkPassphrase("load-key -n", fs, e, passphrase)
	})
}

func checkPassphrase(op, fs string, e *entry, passphrase []byte) error {
	if e.passphrase != string(passphrase) {
		return fmt.Errorf("zfs %s %s: Incorrect key provided: %w", op, fs, zfs.ErrWrongKey)
	}
	return nil
}

// KeyLoaded tells whether the key of encryption root fs is loaded, for
// assertions.
func (f *Fake) KeyLoaded(fs string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.datasets[fs]
	return ok && e.keyLoaded
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
