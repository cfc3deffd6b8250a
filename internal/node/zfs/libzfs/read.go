//go:build linux && cgo

package libzfs

/*
#include "shim.h"
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// read reads one dataset: the numbers from the statistics zfs_open
// fetched, and the user properties z reads, set on the dataset itself.
func (z *ZFS) read(h handle, name string) (zfs.Dataset, error) {
	var out zfs.Dataset
	err := h.withDataset("open", name, func(zh *C.zfs_handle_t) error {
		out = z.readOpen(zh)
		return nil
	})
	return out, err
}

// readOpen reads the dataset zh, as read does.
func (z *ZFS) readOpen(zh *C.zfs_handle_t) zfs.Dataset {
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
		GUID:         uint64(n.guid),
		CreateTXG:    uint64(n.createtxg),
		Encrypted:    n.encrypted != 0,
		KeyLoaded:    n.key_loaded != 0,
		KeyRoot:      n.encryption_root != 0,
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
	return out
}

// setProps sets props on name in one call.
func setProps(h handle, name string, props map[string]string) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return withProps(h, "set", name, props, func(nv *C.nvlist_t) C.int { return C.set_props(h.h, cname, nv) })
}
