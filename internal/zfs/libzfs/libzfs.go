//go:build linux && cgo

// Package libzfs implements zfs.Interface on the kernel module through
// libzfs: go-libzfs for renames, destroys and pool health, and its own C
// shim (shim.c) for reads, listings, holds and property sets, which it
// does in one call each where go-libzfs would take many.
//
// libzfs keeps one process-wide handle whose error state and caches are not
// safe for concurrent use, so every call here runs under one lock. Calls are
// short metadata operations (milliseconds); bulk data (zfs send/receive)
// never runs under this lock, so a long transfer cannot stall other volumes.
//
// go-libzfs opens the libzfs handle when the package is loaded; without
// /dev/zfs that handle is NULL and the first call would crash. New checks
// the handle before anything else and returns zfs.ErrUnavailable instead.
package libzfs

/*
#cgo CFLAGS: -I/usr/include/libzfs -I/usr/include/libspl -DHAVE_IOCTL_IN_SYS_IOCTL_H -D_GNU_SOURCE
#cgo LDFLAGS: -lzfs -lnvpair
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	golibzfs "github.com/bicomsystems/go-libzfs"

	"github.com/zfs-nomad/zfs-nomad/internal/zfs"
)

// ZFS implements zfs.Interface on the local kernel module.
type ZFS struct {
	lock      chan struct{} // one token: libzfs is used by one goroutine at a time
	userProps []string      // user properties Get and List read
}

var _ zfs.Interface = (*ZFS)(nil)

// New checks that libzfs is usable and returns an implementation that reads
// the given user properties on Get and List.
func New(userProps ...string) (*ZFS, error) {
	if _, err := os.Stat("/dev/zfs"); err != nil {
		return nil, fmt.Errorf("%w: /dev/zfs is missing (is the zfs kernel module loaded?): %v", zfs.ErrUnavailable, err)
	}
	if C.handle_ok() == 0 {
		return nil, fmt.Errorf("%w: libzfs_init failed (is the zfs module the same version as libzfs, and are we root?)", zfs.ErrUnavailable)
	}
	return &ZFS{lock: make(chan struct{}, 1), userProps: userProps}, nil
}

// do runs f under the libzfs lock, giving up if ctx ends while waiting.
func (z *ZFS) do(ctx context.Context, f func() error) error {
	select {
	case z.lock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for libzfs: %w", ctx.Err())
	}
	defer func() { <-z.lock }()
	if err := ctx.Err(); err != nil {
		return err
	}
	return f()
}

// lastError turns libzfs's error state into an error wrapping the zfs
// sentinel that matches its errno.
func lastError(op, name string) error {
	desc := C.GoString(C.last_error())
	var kind error
	switch C.last_errno() {
	case C.EZFS_NOENT:
		kind = zfs.ErrNotFound
	case C.EZFS_EXISTS:
		kind = zfs.ErrExists
	case C.EZFS_BUSY:
		kind = zfs.ErrBusy
	}
	if kind == nil {
		return fmt.Errorf("zfs %s %s: %s", op, name, desc)
	}
	return fmt.Errorf("zfs %s %s: %s: %w", op, name, desc, kind)
}

func (z *ZFS) Get(ctx context.Context, name string) (zfs.Dataset, error) {
	if err := zfs.ValidateName(name); err != nil {
		return zfs.Dataset{}, err
	}
	var out zfs.Dataset
	err := z.do(ctx, func() error {
		var err error
		out, err = z.read(name)
		return err
	})
	return out, err
}

// List returns name and every filesystem and snapshot below it. A listing
// interrupted by a signal is retried; any other failure is an error, never
// a shorter list.
func (z *ZFS) List(ctx context.Context, name string) ([]zfs.Dataset, error) {
	if err := zfs.ValidateName(name); err != nil {
		return nil, err
	}
	var out []zfs.Dataset
	err := z.do(ctx, func() error {
		names, err := listNames(name)
		if err != nil {
			return err
		}
		out = make([]zfs.Dataset, 0, len(names))
		for _, n := range names {
			ds, err := z.read(n)
			if errors.Is(err, zfs.ErrNotFound) {
				continue // destroyed since it was listed
			}
			if err != nil {
				return err
			}
			out = append(out, ds)
		}
		return nil
	})
	return out, err
}

// listIntrRetries bounds the retries of a listing interrupted by a signal
// (the Go runtime signals its threads; libzfs reports EZFS_INTR).
const listIntrRetries = 5

// listNames returns the names below name, retrying interrupted listings.
// Runs under the libzfs lock.
func listNames(name string) ([]string, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return retryInterrupted("list", name, func(out **C.char) C.int { return C.list_tree(cname, out) })
}

// retryInterrupted runs a listing, retrying it when a signal interrupted
// it, and splits its output into lines. Runs under the libzfs lock.
func retryInterrupted(op, name string, list func(**C.char) C.int) ([]string, error) {
	for attempt := 0; ; attempt++ {
		var buf *C.char
		if list(&buf) == 0 {
			out := C.GoString(buf)
			C.free(unsafe.Pointer(buf))
			if out == "" {
				return nil, nil
			}
			return strings.Split(strings.TrimSuffix(out, "\n"), "\n"), nil
		}
		if C.last_errno() == C.EZFS_INTR && attempt < listIntrRetries {
			continue
		}
		return nil, lastError(op, name)
	}
}

// open opens one dataset without its children.
func (z *ZFS) open(name string) (golibzfs.Dataset, error) {
	d, err := golibzfs.DatasetOpenSingle(name)
	if err != nil {
		if C.last_errno() == C.EZFS_NOENT || strings.Contains(err.Error(), "does not exist") {
			return d, fmt.Errorf("%s: %w", name, zfs.ErrNotFound)
		}
		return d, fmt.Errorf("zfs open %s: %w", name, err)
	}
	return d, nil
}

// withProps runs the libzfs call f with a C nvlist of string properties,
// and turns its failure into the error for op on name.
func withProps(op, name string, props map[string]string, f func(*C.nvlist_t) C.int) error {
	nv := C.props_new()
	if nv == nil {
		return errors.New("out of memory allocating an nvlist")
	}
	defer C.props_free(nv)
	for k, v := range props {
		ck, cv := C.CString(k), C.CString(v)
		rc := C.props_add(nv, ck, cv)
		C.free(unsafe.Pointer(ck))
		C.free(unsafe.Pointer(cv))
		if rc != 0 {
			return fmt.Errorf("adding property %s to an nvlist failed", k)
		}
	}
	if f(nv) != 0 {
		return lastError(op, name)
	}
	return nil
}

func (z *ZFS) CreateFilesystem(ctx context.Context, name string, props map[string]string) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	return z.do(ctx, func() error {
		cname := C.CString(name)
		defer C.free(unsafe.Pointer(cname))
		return withProps("create", name, props, func(nv *C.nvlist_t) C.int { return C.create_fs(cname, nv) })
	})
}

func (z *ZFS) Snapshot(ctx context.Context, name string, props map[string]string) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	return z.do(ctx, func() error {
		cname := C.CString(name)
		defer C.free(unsafe.Pointer(cname))
		return withProps("snapshot", name, props, func(nv *C.nvlist_t) C.int { return C.snapshot_one(cname, nv) })
	})
}

func (z *ZFS) Clone(ctx context.Context, snapshot, name string, props map[string]string) error {
	for _, n := range []string{snapshot, name} {
		if err := zfs.ValidateName(n); err != nil {
			return err
		}
	}
	return z.do(ctx, func() error {
		csnap, cname := C.CString(snapshot), C.CString(name)
		defer C.free(unsafe.Pointer(csnap))
		defer C.free(unsafe.Pointer(cname))
		return withProps("clone "+snapshot, name, props, func(nv *C.nvlist_t) C.int { return C.clone_fs(csnap, cname, nv) })
	})
}

func (z *ZFS) SetProperties(ctx context.Context, name string, props map[string]string) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	if len(props) == 0 {
		return nil
	}
	return z.do(ctx, func() error { return setProps(name, props) })
}

func (z *ZFS) Rename(ctx context.Context, from, to string) error {
	for _, n := range []string{from, to} {
		if err := zfs.ValidateName(n); err != nil {
			return err
		}
	}
	return z.do(ctx, func() error {
		d, err := z.open(from)
		if err != nil {
			return err
		}
		defer d.Close()
		if err := d.Rename(to, false, false); err != nil {
			return fmt.Errorf("zfs rename %s %s: %w", from, to, err)
		}
		return nil
	})
}

func (z *ZFS) Destroy(ctx context.Context, name string) error {
	return z.destroy(ctx, name, false)
}

func (z *ZFS) DestroyDeferred(ctx context.Context, name string) error {
	if !strings.Contains(name, "@") {
		return fmt.Errorf("deferred destroy of %s: only snapshots can be destroyed deferred", name)
	}
	return z.destroy(ctx, name, true)
}

func (z *ZFS) destroy(ctx context.Context, name string, deferred bool) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	return z.do(ctx, func() error {
		d, err := z.open(name)
		if err != nil {
			return err
		}
		defer d.Close()
		if !strings.Contains(name, "@") { // refuse rather than fail midway
			below, err := listNames(name)
			if err != nil {
				return err
			}
			if len(below) > 1 {
				return fmt.Errorf("zfs destroy %s: it has %d snapshots or children: %w", name, len(below)-1, zfs.ErrHasDependents)
			}
		}
		if err := d.Destroy(deferred); err != nil {
			switch C.last_errno() {
			case C.EZFS_EXISTS: // a snapshot with clones ("snapshot is cloned")
				return fmt.Errorf("zfs destroy %s: %v: %w", name, err, zfs.ErrHasDependents)
			case C.EZFS_BUSY:
				return fmt.Errorf("zfs destroy %s: %v: %w", name, err, zfs.ErrBusy)
			}
			return fmt.Errorf("zfs destroy %s: %w", name, err)
		}
		return nil
	})
}

func (z *ZFS) ReleaseAll(ctx context.Context, snapshot string) error {
	if err := zfs.ValidateName(snapshot); err != nil || !strings.Contains(snapshot, "@") {
		return fmt.Errorf("release holds of %q: not a snapshot name", snapshot)
	}
	return z.do(ctx, func() error {
		d, err := z.open(snapshot)
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
	})
}

func (z *ZFS) PoolHealth(ctx context.Context, pool string) error {
	return z.do(ctx, func() error {
		p, err := golibzfs.PoolOpen(pool)
		if err != nil {
			return fmt.Errorf("pool %s is not imported: %v: %w", pool, err, zfs.ErrUnavailable)
		}
		defer p.Close()
		health, err := p.GetProperty(golibzfs.PoolPropHealth)
		if err != nil {
			return fmt.Errorf("pool %s: reading health: %w", pool, err)
		}
		if health.Value != "ONLINE" {
			return fmt.Errorf("pool %s is %s, not ONLINE: %w", pool, health.Value, zfs.ErrUnavailable)
		}
		return nil
	})
}
