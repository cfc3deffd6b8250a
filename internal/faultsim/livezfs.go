package faultsim

import (
	"context"
	"io"

	"github.com/zfs-nomad/zfs-nomad/internal/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/zfs/zfscmd"
)

// A node's pool outlives its processes; each incarnation reaches it
// through these wrappers, which fail every call once the incarnation is
// dead. So a goroutine of a crashed process (a tidy after a transfer, a
// handler that was still running) can never change the pool after the
// crash, as it could not in reality. alive also decides, by the dice,
// whether the process crashes at this very call.

type liveZFS struct {
	z     zfs.Interface
	alive func(op, name string) error
}

func (l liveZFS) Get(ctx context.Context, name string) (zfs.Dataset, error) {
	if err := l.alive("get", name); err != nil {
		return zfs.Dataset{}, err
	}
	return l.z.Get(ctx, name)
}

func (l liveZFS) List(ctx context.Context, name string) ([]zfs.Dataset, error) {
	if err := l.alive("list", name); err != nil {
		return nil, err
	}
	return l.z.List(ctx, name)
}

func (l liveZFS) Children(ctx context.Context, name string) ([]zfs.Dataset, error) {
	if err := l.alive("children", name); err != nil {
		return nil, err
	}
	return l.z.Children(ctx, name)
}

func (l liveZFS) UserProperty(ctx context.Context, name, key string) (string, bool, error) {
	if err := l.alive("get", name); err != nil {
		return "", false, err
	}
	return l.z.UserProperty(ctx, name, key)
}

func (l liveZFS) OwnUserProperties(ctx context.Context, name, prefix string) (map[string]string, error) {
	if err := l.alive("get", name); err != nil {
		return nil, err
	}
	return l.z.OwnUserProperties(ctx, name, prefix)
}

func (l liveZFS) ClearUserProperty(ctx context.Context, name, key string) error {
	if err := l.alive("set", name); err != nil {
		return err
	}
	return l.z.ClearUserProperty(ctx, name, key)
}

func (l liveZFS) SnapshotNames(ctx context.Context, fs string) ([]string, error) {
	if err := l.alive("list", fs); err != nil {
		return nil, err
	}
	return l.z.SnapshotNames(ctx, fs)
}

func (l liveZFS) CreateFilesystem(ctx context.Context, name string, props map[string]string) error {
	if err := l.alive("create", name); err != nil {
		return err
	}
	return l.z.CreateFilesystem(ctx, name, props)
}

func (l liveZFS) Snapshot(ctx context.Context, name string, props map[string]string) error {
	if err := l.alive("snapshot", name); err != nil {
		return err
	}
	return l.z.Snapshot(ctx, name, props)
}

func (l liveZFS) Clone(ctx context.Context, snapshot, name string, props map[string]string) error {
	if err := l.alive("clone", name); err != nil {
		return err
	}
	return l.z.Clone(ctx, snapshot, name, props)
}

func (l liveZFS) SetProperties(ctx context.Context, name string, props map[string]string) error {
	if err := l.alive("set", name); err != nil {
		return err
	}
	return l.z.SetProperties(ctx, name, props)
}

func (l liveZFS) Rename(ctx context.Context, from, to string) error {
	if err := l.alive("rename", from); err != nil {
		return err
	}
	return l.z.Rename(ctx, from, to)
}

func (l liveZFS) Destroy(ctx context.Context, name string) error {
	if err := l.alive("destroy", name); err != nil {
		return err
	}
	return l.z.Destroy(ctx, name)
}

func (l liveZFS) DestroyDeferred(ctx context.Context, name string) error {
	if err := l.alive("destroy", name); err != nil {
		return err
	}
	return l.z.DestroyDeferred(ctx, name)
}

func (l liveZFS) ReleaseAll(ctx context.Context, snapshot string) error {
	if err := l.alive("release", snapshot); err != nil {
		return err
	}
	return l.z.ReleaseAll(ctx, snapshot)
}

func (l liveZFS) PoolHealth(ctx context.Context, pool string) error {
	if err := l.alive("health", pool); err != nil {
		return err
	}
	return l.z.PoolHealth(ctx, pool)
}

type liveStreams struct {
	s     replication.Streams
	alive func(op, name string) error
}

func (l liveStreams) Send(ctx context.Context, spec zfscmd.SendSpec, w io.Writer) (int64, error) {
	if err := l.alive("send", spec.Snapshot); err != nil {
		return 0, err
	}
	return l.s.Send(ctx, spec, w)
}

func (l liveStreams) Receive(ctx context.Context, target string, props map[string]string, r io.Reader) error {
	if err := l.alive("receive", target); err != nil {
		return err
	}
	return l.s.Receive(ctx, target, props, r)
}

func (l liveStreams) Snapshots(ctx context.Context, fs string) ([]zfscmd.Snap, error) {
	if err := l.alive("list", fs); err != nil {
		return nil, err
	}
	return l.s.Snapshots(ctx, fs)
}

func (l liveStreams) Get(ctx context.Context, dataset, prop string) (string, error) {
	if err := l.alive("get", dataset); err != nil {
		return "", err
	}
	return l.s.Get(ctx, dataset, prop)
}

func (l liveStreams) GetAll(ctx context.Context, dataset string, props ...string) (map[string]string, error) {
	if err := l.alive("get", dataset); err != nil {
		return nil, err
	}
	return l.s.GetAll(ctx, dataset, props...)
}

func (l liveStreams) Set(ctx context.Context, dataset string, props map[string]string) error {
	if err := l.alive("set", dataset); err != nil {
		return err
	}
	return l.s.Set(ctx, dataset, props)
}

func (l liveStreams) Snapshot(ctx context.Context, name string) error {
	if err := l.alive("snapshot", name); err != nil {
		return err
	}
	return l.s.Snapshot(ctx, name)
}

func (l liveStreams) Hold(ctx context.Context, snapshot, tag string) error {
	if err := l.alive("hold", snapshot); err != nil {
		return err
	}
	return l.s.Hold(ctx, snapshot, tag)
}

func (l liveStreams) Release(ctx context.Context, snapshot, tag string) error {
	if err := l.alive("release", snapshot); err != nil {
		return err
	}
	return l.s.Release(ctx, snapshot, tag)
}

func (l liveStreams) Holds(ctx context.Context, fs string) (map[string][]string, error) {
	if err := l.alive("holds", fs); err != nil {
		return nil, err
	}
	return l.s.Holds(ctx, fs)
}

func (l liveStreams) Destroy(ctx context.Context, snapshot string) error {
	if err := l.alive("destroy", snapshot); err != nil {
		return err
	}
	return l.s.Destroy(ctx, snapshot)
}

func (l liveStreams) DestroyRecursive(ctx context.Context, fs string) error {
	if err := l.alive("destroy", fs); err != nil {
		return err
	}
	return l.s.DestroyRecursive(ctx, fs)
}

func (l liveStreams) AbortReceive(ctx context.Context, target string) error {
	if err := l.alive("abort", target); err != nil {
		return err
	}
	return l.s.AbortReceive(ctx, target)
}

func (l liveStreams) Rollback(ctx context.Context, snapshot string) error {
	if err := l.alive("rollback", snapshot); err != nil {
		return err
	}
	return l.s.Rollback(ctx, snapshot)
}

func (l liveStreams) Rename(ctx context.Context, from, to string) error {
	if err := l.alive("rename", from); err != nil {
		return err
	}
	return l.s.Rename(ctx, from, to)
}

func (l liveStreams) EstimateSize(ctx context.Context, spec zfscmd.SendSpec) (int64, error) {
	if err := l.alive("estimate", spec.Snapshot); err != nil {
		return 0, err
	}
	return l.s.EstimateSize(ctx, spec)
}

func (l liveStreams) ResumeToken(ctx context.Context, token string) (zfscmd.ResumeInfo, error) {
	if err := l.alive("token", token); err != nil {
		return zfscmd.ResumeInfo{}, err
	}
	return l.s.ResumeToken(ctx, token)
}

func (l liveStreams) Children(ctx context.Context, parent string, props ...string) ([]zfscmd.Child, error) {
	if err := l.alive("children", parent); err != nil {
		return nil, err
	}
	return l.s.Children(ctx, parent, props...)
}
