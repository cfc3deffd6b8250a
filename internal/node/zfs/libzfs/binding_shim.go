//go:build linux && cgo && openzfs_2_2

package libzfs

/*
#include <string.h>
#include "shim.h"

static int shim_destroy(libzfs_handle_t *h, const char *name, int deferred) {
	zfs_handle_t *zh = open_dataset(h, name);
	if (zh == NULL)
		return -1;
	int rc = zfs_destroy(zh, deferred ? B_TRUE : B_FALSE);
	zfs_close(zh);
	return rc;
}

static int shim_rename(libzfs_handle_t *h, const char *from, const char *to) {
	zfs_handle_t *zh = open_dataset(h, from);
	if (zh == NULL)
		return -1;
	renameflags_t flags;
	memset(&flags, 0, sizeof(flags));
	int rc = zfs_rename(zh, to, flags);
	zfs_close(zh);
	return rc;
}

// shim_release_all takes every user hold off a snapshot.
static int shim_release_all(libzfs_handle_t *h, const char *snapshot) {
	zfs_handle_t *zh = zfs_open(h, snapshot, ZFS_TYPE_SNAPSHOT);
	if (zh == NULL)
		return -1;
	nvlist_t *holds = NULL;
	int rc = zfs_get_holds(zh, &holds);
	zfs_close(zh);
	if (rc != 0)
		return rc;
	for (nvpair_t *p = nvlist_next_nvpair(holds, NULL); p != NULL && rc == 0; p = nvlist_next_nvpair(holds, p))
		rc = hold_or_release(h, snapshot, nvpair_name(p), 1);
	nvlist_free(holds);
	return rc;
}
*/
import "C"

import (
	"context"
	"errors"
	"unsafe"
)

// Binding names the library that renames, destroys and releases in this
// build.
const Binding = "shim"

// bindingReady: the shim's calls take the handles New opens, which it
// checks itself.
func bindingReady() error { return nil }

// withBinding runs f on a handle of the shim's pool, as every other call.
func (z *ZFS) withBinding(ctx context.Context, f func(handle) error) error {
	return z.do(ctx, f)
}

func destroyDataset(h handle, name string, deferred bool) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	flag := C.int(0)
	if deferred {
		flag = 1
	}
	if C.shim_destroy(h.h, cname, flag) != 0 {
		return destroyError(h, name, errors.New(C.GoString(C.last_error(h.h))))
	}
	return nil
}

func renameDataset(h handle, from, to string) error {
	cfrom, cto := C.CString(from), C.CString(to)
	defer C.free(unsafe.Pointer(cfrom))
	defer C.free(unsafe.Pointer(cto))
	if C.shim_rename(h.h, cfrom, cto) != 0 {
		return h.lastError("rename "+from, to)
	}
	return nil
}

func releaseAllHolds(h handle, snapshot string) error {
	csnap := C.CString(snapshot)
	defer C.free(unsafe.Pointer(csnap))
	if C.shim_release_all(h.h, csnap) != 0 {
		return h.lastError("release all holds of", snapshot)
	}
	return nil
}
