package zfsfake

import (
	"context"
	"sync/atomic"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// Counting wraps a zfs.Interface and counts the work asked of it: one per
// call, and one per dataset a listing returns (ZFS opens each one it
// lists). Tests use it to find calls whose cost grows with the number of
// volumes on a node.
type Counting struct {
	zfs.Interface
	work atomic.Int64
}

// Work is what was asked so far.
func (c *Counting) Work() int64 { return c.work.Load() }

func (c *Counting) add(n int) { c.work.Add(int64(n)) }

func (c *Counting) Get(ctx context.Context, name string) (zfs.Dataset, error) {
	c.add(1)
	return c.Interface.Get(ctx, name)
}
func (c *Counting) List(ctx context.Context, name string) ([]zfs.Dataset, error) {
	out, err := c.Interface.List(ctx, name)
	c.add(1 + len(out))
	return out, err
}
func (c *Counting) Children(ctx context.Context, name string) ([]zfs.Dataset, error) {
	out, err := c.Interface.Children(ctx, name)
	c.add(1 + len(out))
	return out, err
}
func (c *Counting) UserProperty(ctx context.Context, name, key string) (string, bool, error) {
	c.add(1)
	return c.Interface.UserProperty(ctx, name, key)
}
func (c *Counting) OwnUserProperties(ctx context.Context, name, prefix string) (map[string]string, error) {
	out, err := c.Interface.OwnUserProperties(ctx, name, prefix)
	c.add(1 + len(out))
	return out, err
}
func (c *Counting) ClearUserProperty(ctx context.Context, name, key string) error {
	c.add(1)
	return c.Interface.ClearUserProperty(ctx, name, key)
}
func (c *Counting) SnapshotNames(ctx context.Context, fs string) ([]string, error) {
	out, err := c.Interface.SnapshotNames(ctx, fs)
	c.add(1 + len(out))
	return out, err
}
func (c *Counting) Snapshots(ctx context.Context, fs string) ([]zfs.Snap, error) {
	out, err := c.Interface.Snapshots(ctx, fs)
	c.add(1 + len(out))
	return out, err
}
func (c *Counting) Properties(ctx context.Context, dataset string, props ...string) (map[string]string, error) {
	c.add(1)
	return c.Interface.Properties(ctx, dataset, props...)
}
func (c *Counting) CreateFilesystem(ctx context.Context, name string, props map[string]string) error {
	c.add(1)
	return c.Interface.CreateFilesystem(ctx, name, props)
}
func (c *Counting) Snapshot(ctx context.Context, name string, props map[string]string) error {
	c.add(1)
	return c.Interface.Snapshot(ctx, name, props)
}
func (c *Counting) Clone(ctx context.Context, snapshot, name string, props map[string]string) error {
	c.add(1)
	return c.Interface.Clone(ctx, snapshot, name, props)
}
func (c *Counting) SetProperties(ctx context.Context, name string, props map[string]string) error {
	c.add(1)
	return c.Interface.SetProperties(ctx, name, props)
}
func (c *Counting) Rename(ctx context.Context, from, to string) error {
	c.add(1)
	return c.Interface.Rename(ctx, from, to)
}
func (c *Counting) Destroy(ctx context.Context, name string) error {
	c.add(1)
	return c.Interface.Destroy(ctx, name)
}
func (c *Counting) DestroyDeferred(ctx context.Context, name string) error {
	c.add(1)
	return c.Interface.DestroyDeferred(ctx, name)
}
func (c *Counting) ReleaseAll(ctx context.Context, snapshot string) error {
	c.add(1)
	return c.Interface.ReleaseAll(ctx, snapshot)
}
func (c *Counting) PoolHealth(ctx context.Context, pool string) error {
	c.add(1)
	return c.Interface.PoolHealth(ctx, pool)
}
