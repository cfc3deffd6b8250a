//go:build linux && cgo

package libzfs_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/guesttest"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs/libzfs"
)

// These tests run on real ZFS: in the guest, or on a host with /dev/zfs.
func TestMain(m *testing.M) {
	os.Exit(guesttest.Main(m, guesttest.Options{Disks: []string{"1G"}}))
}

const userProp = "zfs-nomad:test"

func setup(t *testing.T) (*libzfs.ZFS, string) {
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

func TestConcurrentCallsAreSafe(t *testing.T) {
	z, root := setup(t)
	ctx := context.Background()
	const writers = 20
	errs := make(chan error, 2*writers)
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
	for i := 0; i < 2*writers; i++ {
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
