//go:build linux && cgo

package libzfs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// What streams need of ZFS: the streams themselves (send, receive, size
// estimates) and what takes a key run as zfs commands (zfscmd), each its
// own process, so a long transfer never holds a libzfs handle; the short
// reads, snapshots and holds around them run in process. A zfs command
// costs a process start and a libzfs_init each; on the critical path of
// a move there are a dozen of them.

func (z *ZFS) Send(ctx context.Context, spec zfs.SendSpec, w io.Writer) (int64, error) {
	return z.cmd.Send(ctx, spec, w)
}

func (z *ZFS) EstimateSize(ctx context.Context, spec zfs.SendSpec) (int64, error) {
	return z.cmd.EstimateSize(ctx, spec)
}

func (z *ZFS) Receive(ctx context.Context, target string, props map[string]string, r io.Reader) error {
	return z.cmd.Receive(ctx, target, props, r)
}

func (z *ZFS) AbortReceive(ctx context.Context, target string) error {
	return z.cmd.AbortReceive(ctx, target)
}

func (z *ZFS) Rollback(ctx context.Context, snapshot string) error {
	return z.cmd.Rollback(ctx, snapshot)
}

func (z *ZFS) DestroyRecursive(ctx context.Context, fs string) error {
	return z.cmd.DestroyRecursive(ctx, fs)
}

// Encrypted volumes go through the zfs command with the passphrase on its
// standard input: libzfs takes no key material from its caller.

func (z *ZFS) CreateEncrypted(ctx context.Context, name string, props map[string]string, passphrase []byte) error {
	return z.cmd.CreateEncrypted(ctx, name, props, passphrase)
}

func (z *ZFS) CopyEncrypted(ctx context.Context, snapshot, target string, props map[string]string) error {
	return z.cmd.CopyEncrypted(ctx, snapshot, target, props)
}

func (z *ZFS) LoadKey(ctx context.Context, fs string, passphrase []byte) error {
	return z.cmd.LoadKey(ctx, fs, passphrase)
}

func (z *ZFS) CheckKey(ctx context.Context, fs string, passphrase []byte) error {
	return z.cmd.CheckKey(ctx, fs, passphrase)
}

func (z *ZFS) UnloadKey(ctx context.Context, fs string) error { return z.cmd.UnloadKey(ctx, fs) }

// propValueMax bounds a property value (a resume token is the longest).
const propValueMax = 8192

// Properties reads several properties; those unset or not applicable are "-".
func (z *ZFS) Properties(ctx context.Context, dataset string, props ...string) (map[string]string, error) {
	if err := zfs.ValidateName(dataset); err != nil {
		return nil, err
	}
	var values map[string]string
	err := z.do(ctx, func(h handle) error {
		return h.withDataset("get", dataset, func(zh *C.zfs_handle_t) error {
			values = readProps(zh, props)
			return nil
		})
	})
	return values, err
}

// readProps reads props of the open dataset zh as `zfs get -Hp` prints
// them ("-" when unset).
func readProps(zh *C.zfs_handle_t, props []string) map[string]string {
	values := make(map[string]string, len(props))
	buf := (*C.char)(C.malloc(propValueMax))
	defer C.free(unsafe.Pointer(buf))
	for _, p := range props {
		cp := C.CString(p)
		C.prop_get(zh, cp, buf, propValueMax)
		C.free(unsafe.Pointer(cp))
		values[p] = C.GoString(buf)
	}
	return values
}

// Property reads one property ("-" when unset).
func (z *ZFS) Property(ctx context.Context, dataset, prop string) (string, error) {
	values, err := z.Properties(ctx, dataset, prop)
	return values[prop], err
}

// DestroySnapshot destroys one snapshot, and refuses any other name.
func (z *ZFS) DestroySnapshot(ctx context.Context, snapshot string) error {
	if !strings.Contains(snapshot, "@") {
		return fmt.Errorf("refusing to destroy %q: not a snapshot name", snapshot)
	}
	return z.Destroy(ctx, snapshot)
}

// Snapshots lists the snapshots of one filesystem, oldest first.
func (z *ZFS) Snapshots(ctx context.Context, fs string) ([]zfs.Snap, error) {
	lines, err := z.snapshotLines(ctx, fs, C.SNAPSHOT_DETAILS)
	if err != nil {
		return nil, err
	}
	snaps := make([]zfs.Snap, 0, len(lines))
	for _, line := range lines {
		f := strings.Split(line, "\t")
		if len(f) != 5 {
			return nil, fmt.Errorf("listing snapshots of %s: unexpected line %q", fs, line)
		}
		guid, err1 := strconv.ParseUint(f[1], 10, 64)
		txg, err2 := strconv.ParseUint(f[2], 10, 64)
		created, err3 := strconv.ParseInt(f[3], 10, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("listing snapshots of %s: line %q: %w", fs, line, err)
		}
		snaps = append(snaps, zfs.Snap{Name: f[0], GUID: guid, CreateTXG: txg, Created: created, Deferred: f[4] == "1"})
	}
	sort.Slice(snaps, func(i, j int) bool { return snaps[i].CreateTXG < snaps[j].CreateTXG })
	return snaps, nil
}

// Holds returns the hold tags of every snapshot of fs that has any.
func (z *ZFS) Holds(ctx context.Context, fs string) (map[string][]string, error) {
	lines, err := z.snapshotLines(ctx, fs, C.SNAPSHOT_HOLDS)
	if err != nil {
		return nil, err
	}
	holds := map[string][]string{}
	for _, line := range lines {
		if snap, tag, ok := strings.Cut(line, "\t"); ok {
			holds[snap] = append(holds[snap], tag)
		}
	}
	for _, tags := range holds {
		sort.Strings(tags)
	}
	return holds, nil
}

// ChildProperties lists the filesystems directly below parent with props,
// read from the listing's own handles.
func (z *ZFS) ChildProperties(ctx context.Context, parent string, props ...string) ([]zfs.Child, error) {
	if err := zfs.ValidateName(parent); err != nil {
		return nil, err
	}
	var children []zfs.Child
	err := z.do(ctx, func(h handle) error {
		var err error
		children, err = eachListed(h, parent, childFilesystems(h), func(zh *C.zfs_handle_t) zfs.Child {
			return zfs.Child{Name: C.GoString(C.zfs_get_name(zh)), Props: readProps(zh, props)}
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(children, func(i, j int) bool { return children[i].Name < children[j].Name })
	return children, nil
}

// ResumeToken decodes a receive resume token with libzfs itself, so a
// sender can check what a peer's token asks for before it sends.
func (z *ZFS) ResumeToken(ctx context.Context, token string) (zfs.ResumeInfo, error) {
	var info zfs.ResumeInfo
	err := z.do(ctx, func(h handle) error {
		ct := C.CString(token)
		defer C.free(unsafe.Pointer(ct))
		var out C.resume_info_t
		if C.resume_token_info(h.h, ct, &out) != 0 {
			return fmt.Errorf("the resume token does not decode: %s", C.GoString(C.last_error(h.h)))
		}
		info = zfs.ResumeInfo{ToName: C.GoString(&out.toname[0]), ToGUID: uint64(out.toguid), FromGUID: uint64(out.fromguid), Raw: out.raw != 0}
		return nil
	})
	return info, err
}

// Hold puts hold tag on snapshot; holding twice is fine.
func (z *ZFS) Hold(ctx context.Context, snapshot, tag string) error {
	return z.holdOrRelease(ctx, "hold", snapshot, tag, C.EZFS_REFTAG_HOLD, func(h handle, cs, ct *C.char) C.int { return C.hold_or_release(h.h, cs, ct, 0) })
}

// Release removes hold tag from snapshot; a missing hold is fine.
func (z *ZFS) Release(ctx context.Context, snapshot, tag string) error {
	return z.holdOrRelease(ctx, "release", snapshot, tag, C.EZFS_REFTAG_RELE, func(h handle, cs, ct *C.char) C.int { return C.hold_or_release(h.h, cs, ct, 1) })
}

// holdOrRelease runs op, taking the errno that says it was done already
// as success.
func (z *ZFS) holdOrRelease(ctx context.Context, op, snapshot, tag string, done C.int, f func(h handle, cs, ct *C.char) C.int) error {
	if err := zfs.ValidateName(snapshot); err != nil || !strings.Contains(snapshot, "@") {
		return fmt.Errorf("zfs %s %s: not a snapshot name", op, snapshot)
	}
	return z.do(ctx, func(h handle) error {
		cs, ct := C.CString(snapshot), C.CString(tag)
		defer C.free(unsafe.Pointer(cs))
		defer C.free(unsafe.Pointer(ct))
		if f(h, cs, ct) == 0 || h.errno() == done {
			return nil
		}
		return h.lastError(op+" "+tag, snapshot)
	})
}
