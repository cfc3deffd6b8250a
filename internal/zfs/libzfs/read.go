//go:build linux && cgo

package libzfs

/*
#cgo CFLAGS: -I/usr/include/libzfs -I/usr/include/libspl -DHAVE_IOCTL_IN_SYS_IOCTL_H -D_GNU_SOURCE
#cgo LDFLAGS: -lzfs -lnvpair
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <libzfs.h>
#include <libnvpair.h>

extern libzfs_handle_t *libzfsHandle;

static zfs_handle_t *open_dataset(const char *name) {
	return zfs_open(libzfsHandle, name, ZFS_TYPE_FILESYSTEM | ZFS_TYPE_SNAPSHOT | ZFS_TYPE_VOLUME);
}

// The numbers zfs.Dataset needs, all from the statistics zfs_open read:
// no further ioctls, unlike reading every property by name.
typedef struct {
	int type;
	uint64_t used, referenced, available, quota, refquota, creation, defer_destroy, readonly;
} numbers_t;

static void read_numbers(zfs_handle_t *zh, numbers_t *n) {
	n->type = zfs_get_type(zh);
	n->used = zfs_prop_get_int(zh, ZFS_PROP_USED);
	n->referenced = zfs_prop_get_int(zh, ZFS_PROP_REFERENCED);
	n->creation = zfs_prop_get_int(zh, ZFS_PROP_CREATION);
	n->readonly = zfs_prop_get_int(zh, ZFS_PROP_READONLY);
	if (n->type == ZFS_TYPE_SNAPSHOT) {
		n->defer_destroy = zfs_prop_get_int(zh, ZFS_PROP_DEFER_DESTROY);
	} else {
		n->available = zfs_prop_get_int(zh, ZFS_PROP_AVAILABLE);
		n->quota = zfs_prop_get_int(zh, ZFS_PROP_QUOTA);
		n->refquota = zfs_prop_get_int(zh, ZFS_PROP_REFQUOTA);
	}
}

static void read_origin(zfs_handle_t *zh, char *buf, size_t len) {
	if (zfs_get_type(zh) == ZFS_TYPE_SNAPSHOT ||
	    zfs_prop_get(zh, ZFS_PROP_ORIGIN, buf, len, NULL, NULL, 0, B_TRUE) != 0)
		buf[0] = 0;
}

// own_user_prop copies a user property set on this dataset itself (locally
// or by a receive) into buf and returns 1; inherited or unset: 0. The
// source test is the one `zfs get` makes.
static int own_user_prop(zfs_handle_t *zh, const char *key, char *buf, size_t len) {
	nvlist_t *entry = NULL;
	char *value = NULL, *source = NULL;
	if (nvlist_lookup_nvlist(zfs_get_user_props(zh), key, &entry) != 0 ||
	    nvlist_lookup_string(entry, ZPROP_VALUE, &value) != 0 ||
	    nvlist_lookup_string(entry, ZPROP_SOURCE, &source) != 0)
		return 0;
	if (strcmp(source, zfs_get_name(zh)) != 0 && strcmp(source, ZPROP_SOURCE_VAL_RECVD) != 0)
		return 0;
	snprintf(buf, len, "%s", value);
	return 1;
}

// set_props sets every property of props in one call: one sync task for
// all of them, where one zfs_prop_set per property waits for one each.
static int set_props(const char *name, nvlist_t *props) {
	zfs_handle_t *zh = open_dataset(name);
	if (zh == NULL)
		return -1;
	int rc = zfs_prop_set_list(zh, props);
	zfs_close(zh);
	return rc;
}
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/zfs-nomad/zfs-nomad/internal/zfs"
)

// read reads one dataset: the numbers from the statistics zfs_open
// fetched, and the user properties z reads, set on the dataset itself.
// Runs under the libzfs lock.
func (z *ZFS) read(name string) (zfs.Dataset, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	zh := C.open_dataset(cname)
	if zh == nil {
		return zfs.Dataset{}, lastError("open", name)
	}
	defer C.zfs_close(zh)

	var n C.numbers_t
	C.read_numbers(zh, &n)
	out := zfs.Dataset{
		Name:         C.GoString(C.zfs_get_name(zh)),
		Used:         uint64(n.used),
		Referenced:   uint64(n.referenced),
		Available:    uint64(n.available),
		Quota:        uint64(n.quota),
		RefQuota:     uint64(n.refquota),
		Created:      time.Unix(int64(n.creation), 0),
		DeferDestroy: n.defer_destroy != 0,
		ReadOnly:     n.readonly != 0,
		User:         map[string]string{},
	}
	switch n._type {
	case C.ZFS_TYPE_FILESYSTEM:
		out.Type = zfs.Filesystem
	case C.ZFS_TYPE_SNAPSHOT:
		out.Type = zfs.Snapshot
	}
	buf := (*C.char)(C.malloc(propValueMax))
	defer C.free(unsafe.Pointer(buf))
	C.read_origin(zh, buf, propValueMax)
	out.Origin = C.GoString(buf)
	for _, key := range z.userProps {
		ckey := C.CString(key)
		if C.own_user_prop(zh, ckey, buf, propValueMax) == 1 {
			out.User[key] = C.GoString(buf)
		}
		C.free(unsafe.Pointer(ckey))
	}
	return out, nil
}

// setProps sets props on name in one call. Runs under the libzfs lock.
func setProps(name string, props map[string]string) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	rc, err := withProps(props, func(nv *C.nvlist_t) C.int { return C.set_props(cname, nv) })
	if err != nil {
		return err
	}
	if rc != 0 {
		return lastError("set", name)
	}
	return nil
}
