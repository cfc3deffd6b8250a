package faultsim

import (
	"context"
	"io"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// A node's pool outlives its processes; each incarnation reaches it
// through these wrappers, which fail every call once the incarnation is
// dead. So a goroutine of a crashed process (a tidy after a transfer, a
// handler that was still running) can never change the pool after the
// crash, as it could not in reality. enter also decides, by the dice,
// whether the process crashes at this very call.
//
// A call holds its node's calls lock (read) from the check to its end,
// and a new incarnation starts only once every call of the dead one has
// ended (simNode.start). Without that, a call that passed the check just
// before the crash could land after the next incarnation had listed the
// pool (seed 13416 found an index entry for a primary renamed that way),
// where in reality a process's last change precedes its successor's
// start. Send and Receive are only checked at their start: they wait on
// the network, and a stopped incarnation's server and connections end
// them.

// gate lets a call into the pool through, or fails it; done ends the
// call.
type gate func(op, name string) (done func(), err error)

// call runs f through g.
func call[T any](g gate, op, name string, f func() (T, error)) (T, error) {
	done, err := g(op, name)
	if err != nil {
		var zero T
		return zero, err
	}
	defer done()
	return f()
}

// call0 is call for what returns only an error.
func call0(g gate, op, name string, f func() error) error {
	_, err := call(g, op, name, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

// check lets a call that may wait on the network through g, without
// holding it.
func check(g gate, op, name string) error {
	done, err := g(op, name)
	if err == nil {
		done()
	}
	return err
}

type liveZFS struct {
	z     zfs.Interface
	enter gate
}

func (l liveZFS) Get(ctx context.Context, name string) (zfs.Dataset, error) {
	return call(l.enter, "get", name, func() (zfs.Dataset, error) { return l.z.Get(ctx, name) })
}

func (l liveZFS) List(ctx context.Context, name string) ([]zfs.Dataset, error) {
	return call(l.enter, "list", name, func() ([]zfs.Dataset, error) { return l.z.List(ctx, name) })
}

func (l liveZFS) Children(ctx context.Context, name string) ([]zfs.Dataset, error) {
	return call(l.enter, "children", name, func() ([]zfs.Dataset, error) { return l.z.Children(ctx, name) })
}

func (l liveZFS) UserProperty(ctx context.Context, name, key string) (string, bool, error) {
	done, err := l.enter("get", name)
	if err != nil {
		return "", false, err
	}
	defer done()
	return l.z.UserProperty(ctx, name, key)
}

func (l liveZFS) OwnUserProperties(ctx context.Context, name, prefix string) (map[string]string, error) {
	return call(l.enter, "get", name, func() (map[string]string, error) { return l.z.OwnUserProperties(ctx, name, prefix) })
}

func (l liveZFS) ClearUserProperty(ctx context.Context, name, key string) error {
	return call0(l.enter, "set", name, func() error { return l.z.ClearUserProperty(ctx, name, key) })
}

func (l liveZFS) SnapshotNames(ctx context.Context, fs string) ([]string, error) {
	return call(l.enter, "list", fs, func() ([]string, error) { return l.z.SnapshotNames(ctx, fs) })
}

func (l liveZFS) CreateFilesystem(ctx context.Context, name string, props map[string]string) error {
	return call0(l.enter, "create", name, func() error { return l.z.CreateFilesystem(ctx, name, props) })
}

func (l liveZFS) Snapshot(ctx context.Context, name string, props map[string]string) error {
	return call0(l.enter, "snapshot", name, func() error { return l.z.Snapshot(ctx, name, props) })
}

func (l liveZFS) Clone(ctx context.Context, snapshot, name string, props map[string]string) error {
	return call0(l.enter, "clone", name, func() error { return l.z.Clone(ctx, snapshot, name, props) })
}

func (l liveZFS) SetProperties(ctx context.Context, name string, props map[string]string) error {
	return call0(l.enter, "set", name, func() error { return l.z.SetProperties(ctx, name, props) })
}

func (l liveZFS) Rename(ctx context.Context, from, to string) error {
	return call0(l.enter, "rename", from, func() error { return l.z.Rename(ctx, from, to) })
}

func (l liveZFS) Destroy(ctx context.Context, name string) error {
	return call0(l.enter, "destroy", name, func() error { return l.z.Destroy(ctx, name) })
}

func (l liveZFS) DestroyDeferred(ctx context.Context, name string) error {
	return call0(l.enter, "destroy", name, func() error { return l.z.DestroyDeferred(ctx, name) })
}

func (l liveZFS) ReleaseAll(ctx context.Context, snapshot string) error {
	return call0(l.enter, "release", snapshot, func() error { return l.z.ReleaseAll(ctx, snapshot) })
}

func (l liveZFS) PoolHealth(ctx context.Context, pool string) error {
	return call0(l.enter, "health", pool, func() error { return l.z.PoolHealth(ctx, pool) })
}

// What streams need, through the same gate.

func (l liveZFS) Send(ctx context.Context, spec zfs.SendSpec, w io.Writer) (int64, error) {
	if err := check(l.enter, "send", spec.Snapshot); err != nil {
		return 0, err
	}
	return l.z.Send(ctx, spec, w)
}

func (l liveZFS) Receive(ctx context.Context, target string, props map[string]string, r io.Reader) error {
	if err := check(l.enter, "receive", target); err != nil {
		return err
	}
	return l.z.Receive(ctx, target, props, r)
}

func (l liveZFS) Snapshots(ctx context.Context, fs string) ([]zfs.Snap, error) {
	return call(l.enter, "list", fs, func() ([]zfs.Snap, error) { return l.z.Snapshots(ctx, fs) })
}

func (l liveZFS) Property(ctx context.Context, dataset, prop string) (string, error) {
	return call(l.enter, "get", dataset, func() (string, error) { return l.z.Property(ctx, dataset, prop) })
}

func (l liveZFS) Properties(ctx context.Context, dataset string, props ...string) (map[string]string, error) {
	return call(l.enter, "get", dataset, func() (map[string]string, error) { return l.z.Properties(ctx, dataset, props...) })
}

func (l liveZFS) Hold(ctx context.Context, snapshot, tag string) error {
	return call0(l.enter, "hold", snapshot, func() error { return l.z.Hold(ctx, snapshot, tag) })
}

func (l liveZFS) Release(ctx context.Context, snapshot, tag string) error {
	return call0(l.enter, "release", snapshot, func() error { return l.z.Release(ctx, snapshot, tag) })
}

func (l liveZFS) Holds(ctx context.Context, fs string) (map[string][]string, error) {
	return call(l.enter, "holds", fs, func() (map[string][]string, error) { return l.z.Holds(ctx, fs) })
}

func (l liveZFS) DestroySnapshot(ctx context.Context, snapshot string) error {
	return call0(l.enter, "destroy", snapshot, func() error { return l.z.DestroySnapshot(ctx, snapshot) })
}

func (l liveZFS) DestroyRecursive(ctx context.Context, fs string) error {
	return call0(l.enter, "destroy", fs, func() error { return l.z.DestroyRecursive(ctx, fs) })
}

func (l liveZFS) AbortReceive(ctx context.Context, target string) error {
	return call0(l.enter, "abort", target, func() error { return l.z.AbortReceive(ctx, target) })
}

func (l liveZFS) Rollback(ctx context.Context, snapshot string) error {
	return call0(l.enter, "rollback", snapshot, func() error { return l.z.Rollback(ctx, snapshot) })
}

func (l liveZFS) EstimateSize(ctx context.Context, spec zfs.SendSpec) (int64, error) {
	return call(l.enter, "estimate", spec.Snapshot, func() (int64, error) { return l.z.EstimateSize(ctx, spec) })
}

func (l liveZFS) ResumeToken(ctx context.Context, token string) (zfs.ResumeInfo, error) {
	return call(l.enter, "token", token, func() (zfs.ResumeInfo, error) { return l.z.ResumeToken(ctx, token) })
}

func (l liveZFS) ChildProperties(ctx context.Context, parent string, props ...string) ([]zfs.Child, error) {
	return call(l.enter, "children", parent, func() ([]zfs.Child, error) { return l.z.ChildProperties(ctx, parent, props...) })
}

// Keys: the simulation runs no encrypted volume; a call would go through
// the gate as any other.

func (l liveZFS) CreateEncrypted(ctx context.Context, name string, props map[string]string, passphrase []byte) error {
	return call0(l.enter, "create", name, func() error { return l.z.CreateEncrypted(ctx, name, props, passphrase) })
}

func (l liveZFS) CopyEncrypted(ctx context.Context, snapshot, target string, props map[string]string) error {
	return call0(l.enter, "clone", target, func() error { return l.z.CopyEncrypted(ctx, snapshot, target, props) })
}

func (l liveZFS) LoadKey(ctx context.Context, fs string, passphrase []byte) error {
	return call0(l.enter, "key", fs, func() error { return l.z.LoadKey(ctx, fs, passphrase) })
}

func (l liveZFS) CheckKey(ctx context.Context, fs string, passphrase []byte) error {
	return call0(l.enter, "key", fs, func() error { return l.z.CheckKey(ctx, fs, passphrase) })
}

func (l liveZFS) UnloadKey(ctx context.Context, fs string) error {
	return call0(l.enter, "key", fs, func() error { return l.z.UnloadKey(ctx, fs) })
}
