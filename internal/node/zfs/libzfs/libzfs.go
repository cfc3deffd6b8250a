//go:build linux && cgo

// Package libzfs implements zfs.Interface on the kernel module through
// libzfs: its own C shim (shim.c) for reads, listings, holds, property
// sets and the pool's health and space, which it does in one call each
// where go-libzfs would take many, and a binding for renames, destroys and
// releases that depends on the libzfs it is built against (docs/architecture.md,
// "OpenZFS versions"):
//
//   - OpenZFS 2.1 (the default build): go-libzfs v0.4.0 (binding_golibzfs.go).
//   - OpenZFS 2.2 and newer (build tag openzfs_2_2, which hack/gobuild.sh
//     sets from the libzfs version): go-libzfs does not compile there, so
//     the shim makes those calls too (binding_shim.go).
//
// A libzfs handle's error state and caches are not safe for concurrent
// use, so each call takes a handle of its own from a small pool (do), and
// go-libzfs's calls take the one handle go-libzfs keeps (withBinding). A
// call that changes something holds its handle while the change syncs, so
// calls for other volumes use the other handles meanwhile. Bulk data (zfs
// send/receive) never holds a handle, so a long transfer stalls nothing.
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
	"runtime/cgo"
	"sort"
	"strings"
	"sync"
	"unsafe"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfscmd"
)

// ZFS implements zfs.Interface on the local kernel module.
type ZFS struct {
	userProps []string // user properties Get and List read
	// cmd runs the streams and what takes a key (streams.go).
	cmd zfscmd.Cmd
}

var _ zfs.Interface = (*ZFS)(nil)

// poolSize is how many libzfs calls may run at once. A call that changes
// something waits for a transaction group to sync (tens of milliseconds,
// more on a busy pool); with several handles, calls for other volumes
// need not queue behind it, and concurrent changes share one sync.
const poolSize = 4

// A handle is one libzfs handle, used by one goroutine at a time.
type handle struct{ h *C.libzfs_handle_t }

var (
	// handles holds the shim's own handles, opened once per process:
	// libzfs_init also initialises libzfs's global property tables.
	handles     chan handle
	handlesOnce sync.Once
	handlesErr  error
)

func openHandles() {
	handles = make(chan handle, poolSize)
	for range poolSize {
		h := C.libzfs_init()
		if h == nil {
			handlesErr = fmt.Errorf("%w: libzfs_init failed (is the zfs module the same version as libzfs, and are we root?)", zfs.ErrUnavailable)
			return
		}
		handles <- handle{h}
	}
}

// New checks that libzfs is usable and returns an implementation that reads
// the given user properties on Get and List.
func New(userProps ...string) (*ZFS, error) {
	if _, err := os.Stat("/dev/zfs"); err != nil {
		return nil, fmt.Errorf("%w: /dev/zfs is missing (is the zfs kernel module loaded?): %v", zfs.ErrUnavailable, err)
	}
	if err := bindingReady(); err != nil {
		return nil, err
	}
	handlesOnce.Do(openHandles)
	if handlesErr != nil {
		return nil, handlesErr
	}
	return &ZFS{userProps: userProps}, nil
}

// do runs f with a handle of its own, giving up if ctx ends while waiting
// for one.
func (z *ZFS) do(ctx context.Context, f func(handle) error) error {
	var h handle
	select {
	case h = <-handles:
	case <-ctx.Done():
		return fmt.Errorf("waiting for libzfs: %w", ctx.Err())
	}
	defer func() { handles <- h }()
	if err := ctx.Err(); err != nil {
		return err
	}
	return f(h)
}

func (h handle) errno() C.int { return C.last_errno(h.h) }

// lastError turns the handle's error state into an error wrapping the zfs
// sentinel that matches its errno.
// withDataset opens the dataset name for fn and closes it afterwards; op
// names the call in the error when it cannot be opened.
func (h handle) withDataset(op, name string, fn func(zh *C.zfs_handle_t) error) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	zh := C.open_dataset(h.h, cname)
	if zh == nil {
		return h.lastError(op, name)
	}
	defer C.zfs_close(zh)
	return fn(zh)
}

func (h handle) lastError(op, name string) error {
	desc := C.GoString(C.last_error(h.h))
	var kind error
	switch h.errno() {
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
	err := z.do(ctx, func(h handle) error {
		var err error
		out, err = z.read(h, name)
		return err
	})
	return out, err
}

func (z *ZFS) UserProperty(ctx context.Context, name, key string) (string, bool, error) {
	if err := zfs.ValidateName(name); err != nil {
		return "", false, err
	}
	var value string
	var ok bool
	err := z.do(ctx, func(h handle) error {
		return h.withDataset("open", name, func(zh *C.zfs_handle_t) error {
			ckey := C.CString(key)
			defer C.free(unsafe.Pointer(ckey))
			buf := (*C.char)(C.malloc(propValueMax))
			defer C.free(unsafe.Pointer(buf))
			if C.own_user_prop(zh, ckey, buf, propValueMax) == 1 {
				value, ok = C.GoString(buf), true
			}
			return nil
		})
	})
	return value, ok, err
}

// OwnUserProperties reads, in one open, the user properties set on name
// itself whose keys start with prefix.
func (z *ZFS) OwnUserProperties(ctx context.Context, name, prefix string) (map[string]string, error) {
	if err := zfs.ValidateName(name); err != nil {
		return nil, err
	}
	var lines []string
	err := z.do(ctx, func(h handle) error {
		cname, cprefix := C.CString(name), C.CString(prefix)
		defer C.free(unsafe.Pointer(cname))
		defer C.free(unsafe.Pointer(cprefix))
		var buf *C.char
		if C.own_user_props(h.h, cname, cprefix, &buf) != 0 {
			return h.lastError("open", name)
		}
		defer C.free(unsafe.Pointer(buf))
		if out := C.GoString(buf); out != "" {
			lines = strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	props := make(map[string]string, len(lines)/2)
	for i := 0; i+1 < len(lines); i += 2 {
		props[lines[i]] = lines[i+1]
	}
	return props, nil
}

// ClearUserProperty removes user property key set on name itself (zfs
// inherit); one not set there is no error.
func (z *ZFS) ClearUserProperty(ctx context.Context, name, key string) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	return z.do(ctx, func(h handle) error {
		cname, ckey := C.CString(name), C.CString(key)
		defer C.free(unsafe.Pointer(cname))
		defer C.free(unsafe.Pointer(ckey))
		if C.clear_user_prop(h.h, cname, ckey) != 0 {
			return h.lastError("inherit "+key, name)
		}
		return nil
	})
}

// List returns name and every filesystem and snapshot below it. A listing
// that fails is an error, never a shorter list; signals do not stop one
// (shim.c blocks them while it runs).
func (z *ZFS) List(ctx context.Context, name string) ([]zfs.Dataset, error) {
	return z.readListing(ctx, name, subtree)
}

// Children returns the filesystems directly below name, without their
// snapshots: each is read once, so a node's volumes are counted without
// reading every snapshot of every volume.
func (z *ZFS) Children(ctx context.Context, name string) ([]zfs.Dataset, error) {
	return z.readListing(ctx, name, childFilesystems)
}

// SnapshotNames returns the names of fs's snapshots without reading them.
func (z *ZFS) SnapshotNames(ctx context.Context, fs string) ([]string, error) {
	names, err := z.snapshotLines(ctx, fs, C.SNAPSHOT_NAMES)
	sort.Strings(names)
	return names, err
}

// snapshotLines lists fs's snapshots in one of list_snapshots' modes.
func (z *ZFS) snapshotLines(ctx context.Context, fs string, mode C.int) ([]string, error) {
	if err := zfs.ValidateName(fs); err != nil {
		return nil, err
	}
	var lines []string
	err := z.do(ctx, func(h handle) error {
		var err error
		lines, err = listLines(h, "list snapshots", fs, func(cfs *C.char, out **C.char) C.int { return C.list_snapshots(h.h, cfs, mode, out) })
		return err
	})
	return lines, err
}

// A listing that hands each dataset's handle to listed, with arg
// (visit_subtree, visit_child_filesystems).
type visitListing func(cname *C.char, arg C.uintptr_t) C.int

// subtree visits name and everything below it, on h.
func subtree(h handle) visitListing {
	return func(cname *C.char, arg C.uintptr_t) C.int { return C.visit_subtree(h.h, cname, arg) }
}

// childFilesystems visits the filesystems directly below name, on h.
func childFilesystems(h handle) visitListing {
	return func(cname *C.char, arg C.uintptr_t) C.int { return C.visit_child_filesystems(h.h, cname, arg) }
}

// readListing reads every dataset a listing of name (subtree,
// childFilesystems) visits.
func (z *ZFS) readListing(ctx context.Context, name string, listing func(handle) visitListing) ([]zfs.Dataset, error) {
	if err := zfs.ValidateName(name); err != nil {
		return nil, err
	}
	var out []zfs.Dataset
	err := z.do(ctx, func(h handle) error {
		var err error
		out, err = eachListed(h, name, listing(h), z.readOpen)
		return err
	})
	return out, err
}

// eachListed runs a listing of name and reads each dataset with read from
// the handle the iteration made, while the iteration runs: no dataset is
// opened a second time (at a thousand datasets, a second open per dataset
// cost as much as the listing).
func eachListed[T any](h handle, name string, visit visitListing, read func(zh *C.zfs_handle_t) T) ([]T, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var out []T
	v := cgo.NewHandle(func(zh *C.zfs_handle_t) { out = append(out, read(zh)) })
	defer v.Delete()
	if visit(cname, C.uintptr_t(v)) != 0 {
		return nil, h.lastError("list", name)
	}
	return out, nil
}

// listed is called by the C listings with each dataset's handle, for the
// reader arg names (a cgo.Handle of eachListed's).
//
//export listed
func listed(zh *C.zfs_handle_t, arg C.uintptr_t) {
	cgo.Handle(arg).Value().(func(*C.zfs_handle_t))(zh)
}

// listNames returns the names below name.
func listNames(h handle, name string) ([]string, error) {
	return listLines(h, "list", name, func(cname *C.char, out **C.char) C.int { return C.list_tree(h.h, cname, out) })
}

// listLines runs a listing of name and splits its output into lines.
func listLines(h handle, op, name string, list func(cname *C.char, out **C.char) C.int) ([]string, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var buf *C.char
	if list(cname, &buf) != 0 {
		return nil, h.lastError(op, name)
	}
	out := C.GoString(buf)
	C.free(unsafe.Pointer(buf))
	if out == "" {
		return nil, nil
	}
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n"), nil
}

// withProps runs the libzfs call f with a C nvlist of string properties,
// and turns its failure into the error for op on name.
func withProps(h handle, op, name string, props map[string]string, f func(*C.nvlist_t) C.int) error {
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
		return h.lastError(op, name)
	}
	return nil
}

func (z *ZFS) CreateFilesystem(ctx context.Context, name string, props map[string]string) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	return z.do(ctx, func(h handle) error {
		cname := C.CString(name)
		defer C.free(unsafe.Pointer(cname))
		return withProps(h, "create", name, props, func(nv *C.nvlist_t) C.int { return C.create_fs(h.h, cname, nv) })
	})
}

func (z *ZFS) Snapshot(ctx context.Context, name string, props map[string]string) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	return z.do(ctx, func(h handle) error {
		cname := C.CString(name)
		defer C.free(unsafe.Pointer(cname))
		return withProps(h, "snapshot", name, props, func(nv *C.nvlist_t) C.int { return C.snapshot_one(h.h, cname, nv) })
	})
}

func (z *ZFS) Clone(ctx context.Context, snapshot, name string, props map[string]string) error {
	for _, n := range []string{snapshot, name} {
		if err := zfs.ValidateName(n); err != nil {
			return err
		}
	}
	return z.do(ctx, func(h handle) error {
		csnap, cname := C.CString(snapshot), C.CString(name)
		defer C.free(unsafe.Pointer(csnap))
		defer C.free(unsafe.Pointer(cname))
		return withProps(h, "clone "+snapshot, name, props, func(nv *C.nvlist_t) C.int { return C.clone_fs(h.h, csnap, cname, nv) })
	})
}

func (z *ZFS) SetProperties(ctx context.Context, name string, props map[string]string) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	if len(props) == 0 {
		return nil
	}
	return z.do(ctx, func(h handle) error { return setProps(h, name, props) })
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
	return z.withBinding(ctx, func(h handle) error {
		if !strings.Contains(name, "@") { // refuse rather than fail midway
			below, err := listNames(h, name)
			if err != nil {
				return err
			}
			if len(below) > 1 {
				return fmt.Errorf("zfs destroy %s: it has %d snapshots or children: %w", name, len(below)-1, zfs.ErrHasDependents)
			}
		}
		return destroyDataset(h, name, deferred)
	})
}

func (z *ZFS) Rename(ctx context.Context, from, to string) error {
	for _, n := range []string{from, to} {
		if err := zfs.ValidateName(n); err != nil {
			return err
		}
	}
	return z.withBinding(ctx, func(h handle) error { return renameDataset(h, from, to) })
}

func (z *ZFS) ReleaseAll(ctx context.Context, snapshot string) error {
	if err := zfs.ValidateName(snapshot); err != nil || !strings.Contains(snapshot, "@") {
		return fmt.Errorf("release holds of %q: not a snapshot name", snapshot)
	}
	return z.withBinding(ctx, func(h handle) error { return releaseAllHolds(h, snapshot) })
}

func (z *ZFS) PoolHealth(ctx context.Context, pool string) error {
	return z.do(ctx, func(h handle) error {
		health, err := poolHealth(h, pool)
		if err != nil {
			return err
		}
		if health != "ONLINE" {
			return fmt.Errorf("pool %s is %s, not ONLINE: %w", pool, health, zfs.ErrUnavailable)
		}
		return nil
	})
}

// PoolSpace reads the pool's own accounting (its size, allocated and free
// bytes), which no dataset property gives: in the process, instead of a
// zpool list process per read.
func (z *ZFS) PoolSpace(ctx context.Context, pool string) (s zfs.PoolSpace, err error) {
	err = z.do(ctx, func(h handle) error {
		s, err = poolSpace(h, pool)
		return err
	})
	return s, err
}

// poolHealth reads the pool's health: "ONLINE", "DEGRADED", ...
func poolHealth(h handle, pool string) (string, error) {
	cpool := C.CString(pool)
	defer C.free(unsafe.Pointer(cpool))
	buf := (*C.char)(C.malloc(64))
	defer C.free(unsafe.Pointer(buf))
	if C.pool_health(h.h, cpool, buf, 64) != 0 {
		return "", fmt.Errorf("pool %s is not imported: %s: %w", pool, C.GoString(C.last_error(h.h)), zfs.ErrUnavailable)
	}
	return C.GoString(buf), nil
}

func poolSpace(h handle, pool string) (zfs.PoolSpace, error) {
	cpool := C.CString(pool)
	defer C.free(unsafe.Pointer(cpool))
	var size, alloc, free C.uint64_t
	if C.pool_space(h.h, cpool, &size, &alloc, &free) != 0 {
		return zfs.PoolSpace{}, fmt.Errorf("pool %s is not imported: %s: %w", pool, C.GoString(C.last_error(h.h)), zfs.ErrUnavailable)
	}
	return zfs.PoolSpace{Size: uint64(size), Allocated: uint64(alloc), Free: uint64(free)}, nil
}

// destroyError classifies a failed destroy by the handle's errno.
func destroyError(h handle, name string, err error) error {
	switch h.errno() {
	case C.EZFS_EXISTS: // a snapshot with clones ("snapshot is cloned")
		return fmt.Errorf("zfs destroy %s: %v: %w", name, err, zfs.ErrHasDependents)
	case C.EZFS_BUSY:
		return fmt.Errorf("zfs destroy %s: %v: %w", name, err, zfs.ErrBusy)
	case C.EZFS_NOENT:
		return fmt.Errorf("zfs destroy %s: %v: %w", name, err, zfs.ErrNotFound)
	}
	return fmt.Errorf("zfs destroy %s: %w", name, err)
}
