//go:build linux && cgo

package libzfs_test

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkCalls times the calls a move's steps are made of, on a
// filesystem with ten snapshots (docs/migration.md, "Move time"): the
// reads GetCopy and a promotion make, and the writes that each wait for
// a pool sync. In the guest: go test -run '^$' -bench Calls -benchtime
// 20x ./internal/node/zfs/libzfs/
func BenchmarkCalls(b *testing.B) {
	z, root := setup(b)
	ctx := context.Background()
	fs := root + "/vol"
	if err := z.CreateFilesystem(ctx, fs, map[string]string{userProp: "x"}); err != nil {
		b.Fatal(err)
	}
	const snapshots = 10
	var written []string
	for i := range snapshots {
		name := fmt.Sprintf("zn-%d", 1000+i)
		if err := z.Snapshot(ctx, fs+"@"+name, nil); err != nil {
			b.Fatal(err)
		}
		written = append(written, "written@"+name)
	}
	calls := []struct {
		name string
		call func(i int) error
	}{
		{"Get", func(int) error { _, err := z.Get(ctx, fs); return err }},
		{"UserProperty", func(int) error { _, _, err := z.UserProperty(ctx, fs, userProp); return err }},
		{"Properties/3", func(int) error {
			_, err := z.Properties(ctx, fs, "receive_resume_token", userProp, "guid")
			return err
		}},
		{"SnapshotNames/10", func(int) error { _, err := z.SnapshotNames(ctx, fs); return err }},
		{"Snapshots/10", func(int) error { _, err := z.Snapshots(ctx, fs); return err }},
		{"Properties/written@10", func(int) error { _, err := z.Properties(ctx, fs, written...); return err }},
		{"SetProperties", func(i int) error { return z.SetProperties(ctx, fs, map[string]string{userProp: fmt.Sprint(i)}) }},
		{"Hold", func(i int) error { return z.Hold(ctx, fs+"@zn-1000", fmt.Sprintf("%s-%d", b.Name(), i)) }},
	}
	for _, c := range calls {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if err := c.call(i); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
