//go:build linux

package mount

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// RootPreparer sets the owner and mode of a new volume's root directory.
// Volumes are mountpoint=legacy and mounted only where they are staged,
// so it mounts the dataset below Dir for the moment.
type RootPreparer struct {
	// Dir holds the temporary mount points: a directory only root can
	// reach (it is created 0700), never a shared one such as /tmp.
	Dir string
}

// PrepareRoot mounts dataset (nosuid, nodev, noexec) below Dir, gives its
// root directory owner uid:gid and mode (-1 keeps one as it is, as in
// chown(2)), and unmounts it. A mount left
// by an earlier attempt is taken off first, so a retry starts clean.
func (p RootPreparer) PrepareRoot(ctx context.Context, dataset string, uid, gid, mode int) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", p.Dir, err)
	}
	target := filepath.Join(p.Dir, strings.ReplaceAll(dataset, "/", "_"))
	if err := Unmount(target); err != nil {
		return err
	}
	if err := ZFS(dataset, target, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC); err != nil {
		return err
	}
	defer func() {
		if uerr := Unmount(target); uerr != nil {
			err = errors.Join(err, uerr)
			return
		}
		_ = os.Remove(target) // an empty mount point: only tidiness
	}()
	// chown first: it may clear setgid, which the chmod then sets.
	if err := unix.Lchown(target, uid, gid); err != nil {
		return fmt.Errorf("chown %d:%d %s: %w", uid, gid, target, err)
	}
	if mode < 0 {
		return nil
	}
	if err := unix.Chmod(target, uint32(mode)); err != nil {
		return fmt.Errorf("chmod %04o %s: %w", mode, target, err)
	}
	return nil
}
