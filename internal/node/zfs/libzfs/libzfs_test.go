//go:build linux && cgo

package libzfs_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"reflect"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/libzfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfscmd"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

// These tests run on real ZFS: in the guest, or on a host with /dev/zfs.
func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{Disks: []string{"1G"}}))
}

const userProp = "zfs-nomad:test"

func setup(t testing.TB) (*libzfs.ZFS, string) {
	t.Helper()
	pool := "ltest"
	guesttest.Pool(t, pool, guesttest.Disk(0))
	z, err := libzfs.New(userProp)
	if err != nil {
		t.Fatal(err)
	}
	root := pool + "/root"
	if err := z.CreateFilesystem(context.Background(), root, nil); err != nil {
		t.Fatal(err)
	}
	return z, root
}

// sameReading compares two readings of a dataset but for the space
// figures, which move while ZFS syncs.
func sameReading(a, b zfs.Dataset) bool {
	a.Used, a.Referenced, a.Available = 0, 0, 0
	b.Used, b.Referenced, b.Available = 0, 0, 0
	return reflect.DeepEqual(a, b)
}

func zfsGet(t *testing.T, prop, name string) string {
	t.Helper()
	out, err := exec.Command("zfs", "get", "-H", "-p", "-o", "value", prop, name).CombinedOutput()
	if err != nil {
		t.Fatalf("zfs get %s %s: %v: %s", prop, name, err, out)
	}
	return string(out[:len(out)-1])
}

func TestDatasetLifecycle(t *testing.T) {
	z, root := setup(t)
	ctx := context.Background()
	fs := root + "/vol"

	// Created with native and user properties in one call.
	err := z.CreateFilesystem(ctx, fs, map[string]string{"refquota": "67108864", "mountpoint": "legacy", "compression": "lz4", userProp: "hello world"})
	if err != nil {
		t.Fatal(err)
	}
	for prop, want := range map[string]string{"refquota": "67108864", "mountpoint": "legacy", "compression": "lz4", userProp: "hello world"} {
		if got := zfsGet(t, prop, fs); got != want {
			t.Errorf("zfs get %s = %q, want %q", prop, got, want)
		}
	}
	ds, err := z.Get(ctx, fs)
	if err != nil {
		t.Fatal(err)
	}
	if ds.Type != zfs.Filesystem || ds.RefQuota != 64<<20 || ds.User[userProp] != "hello world" || ds.Created.IsZero() {
		t.Errorf("Get = %+v", ds)
	}
	// UserProperty reads any user property set on the dataset itself, not
	// only those New was given, and not one inherited from the parent.
	if v, ok, err := z.UserProperty(ctx, fs, userProp); err != nil || !ok || v != "hello world" {
		t.Errorf("UserProperty(%s) = %q, %v, %v", userProp, v, ok, err)
	}
	if err := z.SetProperties(ctx, root, map[string]string{"zfs-nomad:other": "on the root"}); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := z.UserProperty(ctx, root, "zfs-nomad:other"); err != nil || !ok || v != "on the root" {
		t.Errorf("UserProperty of a key New was not given = %q, %v, %v", v, ok, err)
	}
	if v, ok, err := z.UserProperty(ctx, fs, "zfs-nomad:other"); err != nil || ok {
		t.Errorf("UserProperty of an inherited key = %q, %v, %v; want not set", v, ok, err)
	}
	if _, _, err := z.UserProperty(ctx, fs+"-missing", userProp); !errors.Is(err, zfs.ErrNotFound) {
		t.Errorf("UserProperty of a missing dataset: %v, want ErrNotFound", err)
	}
	// OwnUserProperties reads the keys with a prefix set on the dataset
	// itself, none inherited; ClearUserProperty removes one (zfs inherit),
	// and clearing one that is not set is no error.
	if err := z.SetProperties(ctx, root, map[string]string{"zfs-nomad:p:a": "1 n1", "zfs-nomad:p:b": "2 n2"}); err != nil {
		t.Fatal(err)
	}
	if got, err := z.OwnUserProperties(ctx, root, "zfs-nomad:p:"); err != nil || !maps.Equal(got, map[string]string{"zfs-nomad:p:a": "1 n1", "zfs-nomad:p:b": "2 n2"}) {
		t.Errorf("OwnUserProperties(root) = %v, %v", got, err)
	}
	if got, err := z.OwnUserProperties(ctx, fs, "zfs-nomad:"); err != nil || !maps.Equal(got, map[string]string{userProp: "hello world"}) {
		t.Errorf("OwnUserProperties(fs) = %v, %v; want only its own, none inherited", got, err)
	}
	for _, key := range []string{"zfs-nomad:p:a", "zfs-nomad:p:b", "zfs-nomad:p:never-set"} {
		if err := z.ClearUserProperty(ctx, root, key); err != nil {
			t.Errorf("ClearUserProperty(%s): %v", key, err)
		}
	}
	if got, err := z.OwnUserProperties(ctx, root, "zfs-nomad:p:"); err != nil || len(got) != 0 {
		t.Errorf("after clearing: %v, %v; want none", got, err)
	}
	if got := zfsGet(t, "zfs-nomad:p:a", fs); got != "-" {
		t.Errorf("zfs get of a cleared key on the child = %q, want -", got)
	}
	if err := z.ClearUserProperty(ctx, fs+"-missing", userProp); !errors.Is(err, zfs.ErrNotFound) {
		t.Errorf("ClearUserProperty of a missing dataset: %v, want ErrNotFound", err)
	}
	if err := z.CreateFilesystem(ctx, fs, nil); !errors.Is(err, zfs.ErrExists) {
		t.Errorf("second create: %v, want ErrExists", err)
	}

	// Snapshots carry their own user properties and do not inherit the filesystem's.
	snap := fs + "@s1"
	if err := z.Snapshot(ctx, snap, map[string]string{"zfs-nomad:other": "x"}); err != nil {
		t.Fatal(err)
	}
	sds, err := z.Get(ctx, snap)
	if err != nil {
		t.Fatal(err)
	}
	if sds.Type != zfs.Snapshot || sds.User[userProp] != "" {
		t.Errorf("snapshot Get = %+v; want a snapshot without the inherited user property", sds)
	}
	all, err := z.List(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range all {
		names = append(names, d.Name)
	}
	if len(all) != 3 || names[0] != root {
		t.Errorf("List = %v, want root, vol and its snapshot", names)
	}
	// A listing reads each dataset from the listing's own handles: what it
	// reads is what Get reads by name.
	for _, d := range all {
		byName, err := z.Get(ctx, d.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !sameReading(d, byName) {
			t.Errorf("List read %+v\nGet read      %+v", d, byName)
		}
	}
	if err := z.CreateFilesystem(ctx, fs+"/grandchild", nil); err != nil {
		t.Fatal(err)
	}
	children, err := z.Children(ctx, root)
	if err != nil || len(children) != 1 || children[0].Name != fs || children[0].RefQuota != 64<<20 || children[0].User[userProp] != "hello world" {
		t.Errorf("Children(root) = %+v, %v; want vol alone, read in full", children, err)
	}
	if err := z.Snapshot(ctx, fs+"@s0", nil); err != nil {
		t.Fatal(err)
	}
	if snaps, err := z.SnapshotNames(ctx, fs); err != nil || !reflect.DeepEqual(snaps, []string{fs + "@s0", snap}) {
		t.Errorf("SnapshotNames = %v, %v; want %v", snaps, err, []string{fs + "@s0", snap})
	}
	if err := z.Destroy(ctx, fs+"@s0"); err != nil {
		t.Fatal(err)
	}
	if err := z.Destroy(ctx, fs+"/grandchild"); err != nil {
		t.Fatal(err)
	}

	// A filesystem with snapshots is refused, not half-destroyed.
	if err := z.Destroy(ctx, fs); !errors.Is(err, zfs.ErrHasDependents) {
		t.Errorf("destroy with snapshot: %v, want ErrHasDependents", err)
	}

	// Clone, then a deferred destroy of its origin: it stays until the clone goes.
	clone := root + "/clone"
	if err := z.Clone(ctx, snap, clone, map[string]string{"mountpoint": "legacy", userProp: "clone"}); err != nil {
		t.Fatal(err)
	}
	cds, err := z.Get(ctx, clone)
	if err != nil || cds.Origin != snap || cds.User[userProp] != "clone" {
		t.Fatalf("clone Get = %+v, %v", cds, err)
	}
	if err := z.Destroy(ctx, snap); !errors.Is(err, zfs.ErrHasDependents) {
		t.Errorf("destroy snapshot with clone: %v, want ErrHasDependents", err)
	}
	if err := z.DestroyDeferred(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if sds, err := z.Get(ctx, snap); err != nil || !sds.DeferDestroy {
		t.Errorf("after deferred destroy: %+v, %v; want it kept with defer_destroy", sds, err)
	}
	if err := z.Destroy(ctx, clone); err != nil {
		t.Fatal(err)
	}
	if _, err := z.Get(ctx, snap); !errors.Is(err, zfs.ErrNotFound) {
		t.Errorf("origin after its last clone went: %v, want ErrNotFound", err)
	}

	// A held snapshot cannot be destroyed until its holds are released.
	held := fs + "@held"
	if err := z.Snapshot(ctx, held, nil); err != nil {
		t.Fatal(err)
	}
	guesttest.Run(t, "zfs", "hold", "tag-a", held)
	guesttest.Run(t, "zfs", "hold", "tag-b", held)
	if err := z.Destroy(ctx, held); err == nil {
		t.Error("destroyed a held snapshot")
	}
	if err := z.ReleaseAll(ctx, held); err != nil {
		t.Fatal(err)
	}
	if err := z.Destroy(ctx, held); err != nil {
		t.Errorf("destroy after ReleaseAll: %v", err)
	}

	// Properties, rename, destroy.
	if err := z.SetProperties(ctx, fs, map[string]string{"refquota": "134217728", userProp: "changed"}); err != nil {
		t.Fatal(err)
	}
	if got := zfsGet(t, "refquota", fs); got != "134217728" {
		t.Errorf("refquota after set = %s", got)
	}
	if err := z.SetProperties(ctx, fs, map[string]string{"readonly": "on"}); err != nil {
		t.Fatal(err)
	}
	if ds, err := z.Get(ctx, fs); err != nil || !ds.ReadOnly {
		t.Errorf("after readonly=on: ReadOnly=%v, %v", ds.ReadOnly, err)
	}
	if err := z.Rename(ctx, fs, root+"/renamed"); err != nil {
		t.Fatal(err)
	}
	if err := z.Destroy(ctx, root+"/renamed"); err != nil {
		t.Fatal(err)
	}
	if err := z.Destroy(ctx, root+"/renamed"); !errors.Is(err, zfs.ErrNotFound) {
		t.Errorf("destroy twice: %v, want ErrNotFound", err)
	}
}

func TestErrorsAndHealth(t *testing.T) {
	z, root := setup(t)
	ctx := context.Background()
	tests := []struct {
		name string
		run  func() error
		want error
	}{
		{"get missing", func() error { _, err := z.Get(ctx, root+"/missing"); return err }, zfs.ErrNotFound},
		{"list missing", func() error { _, err := z.List(ctx, root+"/missing"); return err }, zfs.ErrNotFound},
		{"children of missing", func() error { _, err := z.Children(ctx, root+"/missing"); return err }, zfs.ErrNotFound},
		{"snapshot names of missing", func() error { _, err := z.SnapshotNames(ctx, root+"/missing"); return err }, zfs.ErrNotFound},
		{"create without parent", func() error { return z.CreateFilesystem(ctx, root+"/a/b", nil) }, zfs.ErrNotFound},
		{"snapshot of missing", func() error { return z.Snapshot(ctx, root+"/missing@s", nil) }, zfs.ErrNotFound},
		{"pool missing", func() error { return z.PoolHealth(ctx, "nosuchpool") }, zfs.ErrUnavailable},
		{"pool healthy", func() error { return z.PoolHealth(ctx, "ltest") }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	for _, bad := range []string{"", "a//b", "a/../b", "a b", "a@b@c", "a;rm"} {
		if err := z.CreateFilesystem(ctx, bad, nil); err == nil {
			t.Errorf("create %q succeeded; want refused", bad)
		}
	}
}

// TestPoolSpaceIsZpoolLists: the pool's space read in the process is what
// zpool list reports, and a pool that is not imported is Unavailable.
func TestPoolSpaceIsZpoolLists(t *testing.T) {
	z, _ := setup(t)
	ctx := context.Background()
	if _, err := z.PoolSpace(ctx, "nosuchpool"); !errors.Is(err, zfs.ErrUnavailable) {
		t.Errorf("the space of a pool not imported: %v, want Unavailable", err)
	}
	var got, want zfs.PoolSpace
	for range 3 { // allocation moves while the pool syncs: read again
		if out, err := exec.Command("zpool", "sync", "ltest").CombinedOutput(); err != nil {
			t.Fatalf("zpool sync: %v: %s", err, out)
		}
		var err error
		if got, err = z.PoolSpace(ctx, "ltest"); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("zpool", "list", "-Hp", "-o", "size,allocated,free", "ltest").CombinedOutput()
		if err != nil {
			t.Fatalf("zpool list: %v: %s", err, out)
		}
		if _, err := fmt.Sscan(string(out), &want.Size, &want.Allocated, &want.Free); err != nil {
			t.Fatalf("zpool list printed %q: %v", out, err)
		}
		if got == want {
			break
		}
	}
	if got != want || got.Size == 0 || got.Allocated == 0 {
		t.Errorf("PoolSpace read %+v, zpool list %+v", got, want)
	}
}

func TestConcurrentCallsAreSafe(t *testing.T) {
	z, root := setup(t)
	ctx := context.Background()
	const writers = 20
	errs := make(chan error, 3*writers)
	for i := 0; i < writers; i++ {
		go func() {
			name := root + "/c" + string(rune('a'+i))
			if err := z.CreateFilesystem(ctx, name, map[string]string{userProp: name}); err != nil {
				errs <- err
				return
			}
			ds, err := z.Get(ctx, name)
			if err == nil && ds.User[userProp] != name {
				err = errors.New("read back the wrong property: " + ds.User[userProp])
			}
			errs <- err
		}()
		go func() { _, err := z.List(ctx, root); errs <- err }()
	}
	// go-libzfs's own handle (renames, destroys) alongside the pool's.
	for i := 0; i < writers; i++ {
		go func() {
			name := root + "/r" + string(rune('a'+i))
			err := z.CreateFilesystem(ctx, name, nil)
			if err == nil {
				err = z.Rename(ctx, name, name+"-renamed")
			}
			if err == nil {
				err = z.Destroy(ctx, name+"-renamed")
			}
			errs <- err
		}()
	}
	for i := 0; i < 3*writers; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// A snapshot is listed, with its user properties, as soon as Snapshot returns.
func TestSnapshotVisibleAtOnce(t *testing.T) {
	z, root := setup(t)
	ctx := context.Background()
	fs := root + "/v"
	if err := z.CreateFilesystem(ctx, fs, map[string]string{userProp: "fs"}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("%s@s%d", fs, i)
		if err := z.Snapshot(ctx, name, map[string]string{userProp: name}); err != nil {
			t.Fatal(err)
		}
		all, err := z.List(ctx, root)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, d := range all {
			if d.Name == name {
				found = true
				if d.User[userProp] != name {
					t.Errorf("%s listed with user property %q", name, d.User[userProp])
				}
			}
		}
		if !found {
			t.Errorf("iteration %d: %s not listed right after creation (%d datasets listed)", i, name, len(all))
		}
	}
}

// TestStreamsMatchZfsCommand: replication's in-process reads, snapshots
// and holds answer exactly what the zfs command answers on the same
// datasets, so the two are interchangeable behind zfs.PropertyReader,
// zfs.SnapshotLister and zfs.Holds.
func TestStreamsMatchZfsCommand(t *testing.T) {
	z, root := setup(t)
	ctx := context.Background()
	in, cmd := z, zfscmd.Cmd{}
	fs := root + "/v1"
	if err := z.CreateFilesystem(ctx, fs, map[string]string{"refquota": "67108864", userProp: "replica"}); err != nil {
		t.Fatal(err)
	}
	if err := z.CreateFilesystem(ctx, root+"/v2", nil); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"s1", "s2", "s3"} {
		if err := in.Snapshot(ctx, fs+"@"+s, nil); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"hold s1 t1", func() error { return in.Hold(ctx, fs+"@s1", "t1") }},
		{"hold s1 t1 again", func() error { return in.Hold(ctx, fs+"@s1", "t1") }},
		{"hold s1 t2", func() error { return in.Hold(ctx, fs+"@s1", "t2") }},
		{"hold s2 t1", func() error { return in.Hold(ctx, fs+"@s2", "t1") }},
		{"release s2 t1", func() error { return in.Release(ctx, fs+"@s2", "t1") }},
		{"release s2 t1 again", func() error { return in.Release(ctx, fs+"@s2", "t1") }},
		{"destroy s3", func() error { return in.DestroySnapshot(ctx, fs+"@s3") }},
		{"set a property", func() error { return in.SetProperties(ctx, fs, map[string]string{"zfs-nomad:generation": "7"}) }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
	}

	reads := []struct {
		name string
		read func(Streamer) (any, error)
	}{
		{"snapshots", func(s Streamer) (any, error) { return s.Snapshots(ctx, fs) }},
		{"holds", func(s Streamer) (any, error) {
			h, err := s.Holds(ctx, fs)
			for _, tags := range h {
				sort.Strings(tags)
			}
			return h, err
		}},
		{"properties", func(s Streamer) (any, error) {
			return s.Properties(ctx, fs, "refquota", "receive_resume_token", "encryption", "guid", userProp, "zfs-nomad:generation", "zfs-nomad:unset")
		}},
		{"inherited user property of a snapshot", func(s Streamer) (any, error) { return s.Property(ctx, fs+"@s1", userProp) }},
		{"children", func(s Streamer) (any, error) { return s.ChildProperties(ctx, root, userProp, "receive_resume_token") }},
	}
	for _, r := range reads {
		got, gerr := r.read(in)
		want, werr := r.read(cmd)
		if gerr != nil || werr != nil {
			t.Errorf("%s: in process: %v, zfs command: %v", r.name, gerr, werr)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n in process  %#v\n zfs command %#v", r.name, got, want)
		}
	}
	if snaps, _ := in.Snapshots(ctx, fs); len(snaps) != 2 {
		t.Errorf("snapshots after destroying s3: %+v, want s1 and s2", snaps)
	}

	failures := []struct {
		name string
		do   func() error
		want error
	}{
		{"get of a missing dataset", func() error { _, err := in.Property(ctx, root+"/missing", "guid"); return err }, zfs.ErrNotFound},
		{"snapshots of a missing dataset", func() error { _, err := in.Snapshots(ctx, root+"/missing"); return err }, zfs.ErrNotFound},
		{"hold of a missing snapshot", func() error { return in.Hold(ctx, fs+"@missing", "t1") }, zfs.ErrNotFound},
		{"destroy of a held snapshot", func() error { return in.DestroySnapshot(ctx, fs+"@s1") }, zfs.ErrBusy},
		{"destroy of a filesystem", func() error { return in.DestroySnapshot(ctx, root+"/v2") }, nil},
	}
	for _, f := range failures {
		err := f.do()
		if err == nil || (f.want != nil && !errors.Is(err, f.want)) {
			t.Errorf("%s: %v, want an error wrapping %v", f.name, err, f.want)
		}
	}
}

// Streamer is what the test reads through both implementations.
type Streamer interface {
	zfs.SnapshotLister
	zfs.PropertyReader
	Holds(ctx context.Context, fs string) (map[string][]string, error)
}

// TestWrittenSinceASnapshot: written@snapshot reads the bytes written
// to a filesystem since that snapshot, newer snapshots or not, as the
// zfs command reads it: what a move's final increment from it sends.
func TestWrittenSinceASnapshot(t *testing.T) {
	z, root := setup(t)
	ctx := context.Background()
	fs := root + "/src"
	if err := z.CreateFilesystem(ctx, fs, map[string]string{"compression": "off", "mountpoint": "legacy"}); err != nil {
		t.Fatal(err)
	}
	if err := z.Snapshot(ctx, fs+"@s1", nil); err != nil {
		t.Fatal(err)
	}
	guesttest.Run(t, "sh", "-c", "mkdir -p /tmp/src && mount -t zfs "+fs+" /tmp/src && dd if=/dev/urandom of=/tmp/src/blob bs=1M count=8 2>/dev/null && umount /tmp/src")
	if err := z.Snapshot(ctx, fs+"@s2", nil); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		snapshot string
		min, max uint64
	}{
		{"s1", 8 << 20, 9 << 20}, // the file, and a little metadata
		{"s2", 0, 1 << 20},
	} {
		prop := "written@" + tt.snapshot
		got, err := z.Property(ctx, fs, prop)
		if err != nil {
			t.Fatalf("%s: %v", prop, err)
		}
		if want := zfsGet(t, prop, fs); got != want {
			t.Errorf("%s = %q in process, %q by the zfs command", prop, got, want)
		}
		if n, err := strconv.ParseUint(got, 10, 64); err != nil || n < tt.min || n > tt.max {
			t.Errorf("%s = %q, want between %d and %d bytes", prop, got, tt.min, tt.max)
		}
	}
	if got, err := z.Property(ctx, fs, "written@missing"); err != nil || got != "-" {
		t.Errorf("written@ a missing snapshot: %q, %v; want \"-\"", got, err)
	}
}

// TestResumeTokenDecodes: a token left by a broken receive decodes to the
// snapshot that was being sent, its guid, its incremental base and
// whether the stream was raw, as a sender needs to check it.
func TestResumeTokenDecodes(t *testing.T) {
	z, root := setup(t)
	ctx := context.Background()
	in := z
	fs, target := root+"/src", root+"/dst"
	if err := z.CreateFilesystem(ctx, fs, map[string]string{"compression": "off", "mountpoint": "legacy"}); err != nil {
		t.Fatal(err)
	}
	guesttest.Run(t, "sh", "-c", "mkdir -p /tmp/src && mount -t zfs "+fs+" /tmp/src && dd if=/dev/urandom of=/tmp/src/blob bs=1M count=8 2>/dev/null && umount /tmp/src")
	for _, s := range []string{"s1", "s2"} {
		if err := in.Snapshot(ctx, fs+"@"+s, nil); err != nil {
			t.Fatal(err)
		}
	}
	guesttest.Run(t, "sh", "-c", "zfs send "+fs+"@s1 | zfs receive -u "+target)
	guesttest.Run(t, "sh", "-c", "mkdir -p /tmp/src && mount -t zfs "+fs+" /tmp/src && dd if=/dev/urandom of=/tmp/src/more bs=1M count=8 2>/dev/null && umount /tmp/src")
	if err := in.Snapshot(ctx, fs+"@s3", nil); err != nil {
		t.Fatal(err)
	}
	// An incremental broken after 1 MiB leaves a token.
	guesttest.Run(t, "sh", "-c", "zfs send -i "+fs+"@s1 "+fs+"@s3 | head -c 1048576 | zfs receive -s -u "+target+" || true")
	token := zfsGet(t, "receive_resume_token", target)
	if token == "-" || token == "" {
		t.Fatal("the broken receive left no resume token")
	}
	info, err := in.ResumeToken(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	want := zfs.ResumeInfo{ToName: fs + "@s3", ToGUID: guid(t, fs+"@s3"), FromGUID: guid(t, fs+"@s1")}
	if info != want {
		t.Errorf("decoded %+v, want %+v", info, want)
	}
	if _, err := in.ResumeToken(ctx, "1-bogus-10-789c"); err == nil {
		t.Error("a bogus token decoded")
	}
}

func guid(t *testing.T, snap string) uint64 {
	t.Helper()
	g, err := strconv.ParseUint(zfsGet(t, "guid", snap), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// A listing is not stopped by signals. The Go runtime signals its threads
// (SIGURG, to preempt a goroutine that has run for 10 ms, which a listing
// calling back into Go for each dataset is); OpenZFS 2.3's list ioctls stop
// with EINTR when a signal is pending, and a listing that gave up after a
// few interrupted attempts failed in CI ("signal received"). Here every
// thread of the process is signalled without pause while the listings run.
func TestListingsSurviveSignals(t *testing.T) {
	z, root := setup(t)
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		if err := z.CreateFilesystem(ctx, fmt.Sprintf("%s/v%d", root, i), nil); err != nil {
			t.Fatal(err)
		}
	}
	for j := 0; j < 3; j++ { // one recursive snapshot is one sync, not twenty
		if out, err := exec.Command("zfs", "snapshot", "-r", fmt.Sprintf("%s@s%d", root, j)).CombinedOutput(); err != nil {
			t.Fatalf("zfs snapshot -r: %v: %s", err, out)
		}
	}
	start := time.Now()
	stop := signalEveryThread(t)
	defer stop()
	defer func() { t.Logf("listings under signals took %v", time.Since(start)) }()
	for i := 0; i < 2; i++ {
		all, err := z.List(ctx, root)
		if err != nil {
			t.Fatalf("listing %d: %v", i, err)
		}
		if len(all) != 4+20*4 { // root and twenty filesystems, three snapshots each
			t.Fatalf("listing %d: %d datasets, want %d", i, len(all), 4+20*4)
		}
		children, err := z.Children(ctx, root)
		if err != nil || len(children) != 20 {
			t.Fatalf("children %d: %d, %v; want 20", i, len(children), err)
		}
		snaps, err := z.SnapshotNames(ctx, root+"/v0")
		if err != nil || len(snaps) != 3 {
			t.Fatalf("snapshot names %d: %v, %v; want 3", i, snaps, err)
		}
	}
}

// signalEveryThread sends SIGURG (which the Go runtime takes and ignores
// when it asked for no preemption) to every thread of the process, over
// and over, until the returned stop is called.
func signalEveryThread(t *testing.T) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	finished := make(chan struct{})
	pid := os.Getpid()
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			default:
			}
			tasks, err := os.ReadDir("/proc/self/task")
			if err != nil {
				t.Errorf("reading the process's threads: %v", err)
				return
			}
			for _, task := range tasks {
				if tid, err := strconv.Atoi(task.Name()); err == nil {
					_ = syscall.Tgkill(pid, tid, syscall.SIGURG)
				}
			}
			time.Sleep(500 * time.Microsecond)
		}
	}()
	return func() { close(done); <-finished }
}

// hungUp is a receiver that hung up: every write fails.
type hungUp struct{}

func (hungUp) Write([]byte) (int, error) { return 0, errors.New("the receiver hung up") }

// snapshotOf creates filesystem fs (with zfs create's options opts), fills
// it with mib MiB of incompressible data and snapshots it as fs@s1.
func snapshotOf(t *testing.T, fs, opts string, mib int) string {
	t.Helper()
	dir := t.TempDir()
	guesttest.Run(t, "sh", "-c", "zfs create -o mountpoint=legacy "+opts+" "+fs+" && mount -t zfs "+fs+" "+dir+
		" && "+guesttest.RandomFile(dir+"/blob", mib)+" && umount "+dir+" && zfs snapshot "+fs+"@s1")
	return fs + "@s1"
}

// within fails the test unless f returns within d; it returns f's error.
func within(t *testing.T, d time.Duration, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s: still running after %s", what, d)
		return nil
	}
}

// TestAStoppedSendEnds: a zfs send whose reader stops half-way ends, and
// so does Send, which ran it for a push whose receiver hung up. On Linux
// the kernel writes the stream from a taskq thread that no signal reaches
// (openzfs/zfs#12500): killed while its pipe's read end stays open and
// unread, zfs send never ends.
func TestAStoppedSendEnds(t *testing.T) {
	_, root := setup(t)
	snap := snapshotOf(t, root+"/src", "-o compression=off", 32) // far more than a pipe holds
	err := within(t, time.Minute, "a send whose receiver hung up", func() error {
		_, err := zfscmd.Cmd{}.Send(context.Background(), zfs.SendSpec{Snapshot: snap}, hungUp{})
		return err
	})
	if err == nil {
		t.Error("a send whose receiver hung up succeeded")
	}
}
