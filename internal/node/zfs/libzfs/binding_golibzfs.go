//go:build linux && cgo && !openzfs_2_2

package libzfs

/*
#include "shim.h"

// The handle go-libzfs opened at load time (its common.c).
extern libzfs_handle_t *libzfsHandle;

static int golibzfs_handle_ok(void) { return libzfsHandle != NULL; }
static libzfs_handle_t *golibzfs_handle(void) { return libzfsHandle; }
*/
import "C"

import (
	"context"
	"fmt"
	"strings"

	golibzfs "github.com/bicomsystems/go-libzfs"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// Binding names the library that renames, destroys and releases in this
// build.
const Binding = "go-libzfs"

// golibzfsHandle guards the handle go-libzfs opened at load time, which
// its calls use: they take it one at a time, beside the shim's pool.
var golibzfsHandle = make(chan struct{}, 1)

// bindingReady checks go-libzfs's handle: go-libzfs opens it when the
// package is loaded, and without /dev/zfs (or with a module of another
// version) it is NULL and the first call would crash.
func bindingReady() error {
	if C.golibzfs_handle_ok() == 0 {
		return fmt.Errorf("%w: libzfs_init failed (is the zfs module the same version as libzfs, and are we root?)", zfs.ErrUnavailable)
	}
	return nil
}

// withBinding runs f, which calls go-libzfs, on go-libzfs's handle.
func (z *ZFS) withBinding(ctx context.Context, f func(handle) error) error {
	select {
	case golibzfsHandle <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for libzfs: %w", ctx.Err())
	}
	defer func() { <-golibzfsHandle }()
	if err := ctx.Err(); err != nil {
		return err
	}
	return f(handle{(*C.libzfs_handle_t)(C.golibzfs_handle())})
}

// openSingle opens one dataset without its children.
func openSingle(h handle, name string) (golibzfs.Dataset, error) {
	d, err := golibzfs.DatasetOpenSingle(name)
	if err != nil {
		if h.errno() == C.EZFS_NOENT || strings.Contains(err.Error(), "does not exist") {
			return d, fmt.Errorf("%s: %w", name, zfs.ErrNotFound)
		}
		return d, fmt.Errorf("zfs open %s: %w", name, err)
	}
	return d, nil
}

func destroyDataset(h handle, name string, deferred bool) error {
	d, err := openSingle(h, name)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Destroy(deferred); err != nil {
		return destroyError(h, name, err)
	}
	return nil
}

func renameDataset(h handle, from, to string) error {
	d, err := openSingle(h, from)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Rename(to, false, false); err != nil {
		return fmt.Errorf("zfs rename %s %s: %w", from, to, err)
	}
	return nil
}

func releaseAllHolds(h handle, snapshot string) error {
	d, err := openSingle(h, snapshot)
	if err != nil {
		return err
	}
	defer d.Close()
	tags, err := d.Holds()
	if err != nil {
		return fmt.Errorf("zfs holds %s: %w", snapshot, err)
	}
	for _, tag := range tags {
		if err := d.Release(tag.Name); err != nil {
			return fmt.Errorf("zfs release %s %s: %w", tag.Name, snapshot, err)
		}
	}
	return nil
}
