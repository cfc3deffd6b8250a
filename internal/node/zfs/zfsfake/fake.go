// Package zfsfake is an in-memory zfs.Interface for unit tests of the logic
// above ZFS. It models names, properties, snapshots, clones, dependents and
// quotas closely enough to exercise that logic; it proves nothing about ZFS
// itself, which the integration tests in the guest do.
//
// It is the whole port, as libzfs is: the datasets (fake.go), keys
// (keys.go), and what streams need (streams.go: GUIDs, createtxg, holds,
// send and receive); file contents are modelled as lists of tokens
// (Write, Content), so that a simulation can check that no write is lost.
package zfsfake

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// Fake is safe for concurrent use.
type Fake struct {
	mu       sync.Mutex
	datasets map[string]*entry
	poolSize uint64
	now      time.Time
	// Fail, when set, is consulted before each operation; a non-nil result
	// is returned instead of doing it. Tests use it to inject faults.
	Fail func(op, name string) error
	// Before, when set, runs before each operation, outside the fake's
	// lock: a test can do another operation there, as a concurrent caller
	// whose call happened to land first would.
	Before func(op, name string)
	// GUIDSeed seeds the GUIDs the fake makes (see nextGUID). New derives
	// it from the pool names, so fakes with the same pools make the same
	// GUIDs: a simulation of several nodes with same-named pools must give
	// each its own seed, or unrelated snapshots would look common to
	// replication. Set it before the first snapshot.
	GUIDSeed uint64
	guids    uint64 // GUIDs made so far
	txg      uint64 // the last createtxg given
}

type entry struct {
	ds    zfs.Dataset
	props map[string]string // native properties as set
	holds []string
	// guid and createTXG are ZFS's: a snapshot keeps its GUID across send
	// and receive; createtxg orders the snapshots of a filesystem.
	guid      uint64
	createTXG uint64
	// content is the file data: tokens in the order written. A snapshot's
	// is frozen at its creation.
	content []string
	// recv is an interrupted receive into this filesystem (streams.go).
	recv *partialRecv
	// passphrase is an encryption root's (keys.go); keyLoaded tells
	// whether its key is loaded.
	passphrase string
	keyLoaded  bool
}

// PutHold puts a user hold on a snapshot, as zfs hold does, past the
// faults and hooks that Hold meets: a test's own setup.
func (f *Fake) PutHold(snapshot, tag string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.datasets[snapshot].holds = append(f.datasets[snapshot].holds, tag)
}

func (f *Fake) ReleaseAll(ctx context.Context, snapshot string) error {
	return f.onDataset("release", snapshot, func(e *entry) error {
		e.holds = nil
		return nil
	})
}

var _ zfs.Interface = (*Fake)(nil)

// New returns a fake with the given pools (each an empty filesystem) of
// poolSize bytes each.
func New(poolSize uint64, pools ...string) *Fake {
	f := &Fake{datasets: map[string]*entry{}, poolSize: poolSize, now: time.Unix(1_700_000_000, 0), GUIDSeed: seedOf(pools)}
	for _, p := range pools {
		f.datasets[p] = &entry{ds: zfs.Dataset{Name: p, Type: zfs.Filesystem, Created: f.now, User: map[string]string{}}, props: map[string]string{},
			guid: f.nextGUID(), createTXG: f.nextTXG()}
	}
	return f
}

// seedOf is the default GUIDSeed: a hash of the pool names, so that the
// same fake is the same in every run.
func seedOf(pools []string) uint64 {
	h := fnv.New64a()
	for _, p := range pools {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// nextGUID returns a new GUID: splitmix64 of the seed and a counter, which
// is deterministic, distinct for every count (splitmix is a bijection), and
// never 0 (ZFS's "no GUID").
func (f *Fake) nextGUID() uint64 {
	for {
		f.guids++
		if g := splitmix64(f.GUIDSeed + f.guids*0x9E3779B97F4A7C15); g != 0 {
			return g
		}
	}
}

func splitmix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// nextTXG returns the createtxg of a new dataset: the pool's transaction
// groups only grow.
func (f *Fake) nextTXG() uint64 {
	f.txg++
	return f.txg
}

// SetNow sets the fake's clock: the creation time of what is created next
// (each creation advances it by a second).
func (f *Fake) SetNow(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = t
}

// SetUsed sets the bytes a dataset uses, to test capacity logic.
func (f *Fake) SetUsed(name string, used uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.datasets[name].ds.Used = used
	f.datasets[name].ds.Referenced = used
}

// Names returns every dataset and snapshot name, sorted.
func (f *Fake) Names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.datasets {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// NativeProperty returns a native property as last set, for assertions.
func (f *Fake) NativeProperty(name, prop string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.datasets[name]; ok {
		return e.props[prop]
	}
	return ""
}

func (f *Fake) before(op, name string) {
	if f.Before != nil {
		f.Before(op, name)
	}
}

// enter starts an operation on name: the test's Before hook (outside the
// lock, so a hook may block), then the fake's lock and the name and
// injected-failure checks. On success the caller holds the lock until it
// calls unlock.
func (f *Fake) enter(op, name string) (unlock func(), err error) {
	f.before(op, name)
	f.mu.Lock()
	if err := f.check(op, name); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	return f.mu.Unlock, nil
}

func (f *Fake) check(op, name string) error {
	if err := zfs.ValidateName(name); err != nil {
		return err
	}
	if f.Fail != nil {
		return f.Fail(op, name)
	}
	return nil
}

// on runs fn, as call op (enter) and under the lock, on the entry find
// returns for name; find's error (one wrapping ErrNotFound) is returned
// as it is.
func (f *Fake) on(op, name string, find func(name string) (*entry, error), fn func(e *entry) error) error {
	unlock, err := f.enter(op, name)
	if err != nil {
		return err
	}
	defer unlock()
	e, err := find(name)
	if err != nil {
		return err
	}
	return fn(e)
}

// onDataset runs fn on dataset name as call op (enter), under the lock:
// ErrNotFound when there is none.
func (f *Fake) onDataset(op, name string, fn func(e *entry) error) error {
	return f.on(op, name, f.dataset, fn)
}

// dataset returns the dataset name, or an error wrapping ErrNotFound.
func (f *Fake) dataset(name string) (*entry, error) {
	e, ok := f.datasets[name]
	if !ok {
		return nil, fmt.Errorf("%s: %w", name, zfs.ErrNotFound)
	}
	return e, nil
}

func (f *Fake) Get(ctx context.Context, name string) (ds zfs.Dataset, err error) {
	err = f.onDataset("get", name, func(e *entry) error {
		ds = f.view(e)
		return nil
	})
	return ds, err
}

func (f *Fake) UserProperty(ctx context.Context, name, key string) (value string, ok bool, err error) {
	err = f.onDataset("get", name, func(e *entry) error {
		value, ok = e.ds.User[key]
		return nil
	})
	return value, ok, err
}

func (f *Fake) OwnUserProperties(ctx context.Context, name, prefix string) (map[string]string, error) {
	out := map[string]string{}
	err := f.onDataset("get", name, func(e *entry) error {
		for k, v := range e.ds.User {
			if strings.HasPrefix(k, prefix) {
				out[k] = v
			}
		}
		return nil
	})
	return out, err
}

func (f *Fake) ClearUserProperty(ctx context.Context, name, key string) error {
	return f.onDataset("set", name, func(e *entry) error {
		delete(e.ds.User, key)
		return nil
	})
}

func (f *Fake) List(ctx context.Context, name string) ([]zfs.Dataset, error) {
	unlock, err := f.enter("list", name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, ok := f.datasets[name]; !ok {
		return nil, fmt.Errorf("%s: %w", name, zfs.ErrNotFound)
	}
	var out []zfs.Dataset
	for _, n := range f.tree(name) {
		out = append(out, f.view(f.datasets[n]))
	}
	return out, nil
}

func (f *Fake) Children(ctx context.Context, name string) ([]zfs.Dataset, error) {
	all, err := f.List(ctx, name)
	if err != nil {
		return nil, err
	}
	var out []zfs.Dataset
	for _, ds := range all {
		if ds.Type == zfs.Filesystem && zfs.Parent(ds.Name) == name {
			out = append(out, ds)
		}
	}
	return out, nil
}

func (f *Fake) SnapshotNames(ctx context.Context, fs string) ([]string, error) {
	all, err := f.List(ctx, fs)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ds := range all {
		if ds.Type == zfs.Snapshot && zfs.Parent(ds.Name) == fs {
			out = append(out, ds.Name)
		}
	}
	return out, nil
}

// view copies an entry and derives Available like ZFS: the pool's free space,
// bounded by the quotas of the dataset and its ancestors.
func (f *Fake) view(e *entry) zfs.Dataset {
	ds := e.ds
	ds.GUID, ds.CreateTXG = e.guid, e.createTXG
	ds.User = map[string]string{}
	for k, v := range e.ds.User {
		ds.User[k] = v
	}
	var used uint64
	for n, o := range f.datasets {
		if o.ds.Type == zfs.Filesystem && !strings.Contains(n, "/") {
			continue
		}
		used += o.ds.Used
	}
	avail := f.poolSize - min(used, f.poolSize)
	for n := ds.Name; n != ""; n = zfs.Parent(n) {
		a := f.datasets[n]
		if a == nil || a.ds.Type != zfs.Filesystem {
			continue
		}
		if q := max(a.ds.Quota, a.ds.RefQuota); q > 0 {
			avail = min(avail, q-min(q, f.usedBelow(n)))
		}
	}
	ds.Available = avail
	if root := f.encryptionRoot(ds.Name); root != nil {
		ds.Encrypted, ds.KeyRoot, ds.KeyLoaded = true, root == e, root.keyLoaded
	}
	return ds
}

func (f *Fake) usedBelow(name string) uint64 {
	var used uint64
	for n, o := range f.datasets {
		if inTree(n, name) {
			used += o.ds.Used
		}
	}
	return used
}

// inTree reports whether dataset n is name itself or lies below it: a
// filesystem under it, or a snapshot of either (what zfs destroy -r
// destroys and zfs rename moves).
func inTree(n, name string) bool {
	return n == name || strings.HasPrefix(n, name+"/") || strings.HasPrefix(n, name+"@")
}

// tree returns the names of the datasets inTree of name, sorted. Collected
// first, so a caller may change the map while it goes through them.
func (f *Fake) tree(name string) []string {
	var out []string
	for n := range f.datasets {
		if inTree(n, name) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func (f *Fake) create(name string, typ zfs.Type, origin string, props map[string]string) error {
	if _, ok := f.datasets[name]; ok {
		return fmt.Errorf("%s: %w", name, zfs.ErrExists)
	}
	parent := zfs.Parent(name)
	if p, ok := f.datasets[parent]; !ok || p.ds.Type != zfs.Filesystem {
		return fmt.Errorf("parent of %s: %w", name, zfs.ErrNotFound)
	}
	f.now = f.now.Add(time.Second)
	e := &entry{ds: zfs.Dataset{Name: name, Type: typ, Created: f.now, Origin: origin, User: map[string]string{}}, props: map[string]string{}}
	if err := setProps(e, props); err != nil {
		return err
	}
	e.guid, e.createTXG = f.nextGUID(), f.nextTXG()
	f.datasets[name] = e
	return nil
}

// readOnlyProps are the native properties ZFS computes; zfs set refuses them.
var readOnlyProps = map[string]bool{
	"name": true, "type": true, "guid": true, "createtxg": true, "creation": true,
	"used": true, "referenced": true, "available": true, "origin": true,
	"receive_resume_token": true, "userrefs": true, "defer_destroy": true,
}

// setProps sets props like ZFS does: a quota that cannot be set fails the
// call, but the other properties are set all the same (seen on OpenZFS
// 2.1 with `refquota` below the space used).
func setProps(e *entry, props map[string]string) error {
	for k := range props {
		if readOnlyProps[k] {
			return fmt.Errorf("cannot set property %s on %s: read-only property", k, e.ds.Name)
		}
	}
	var quotaErr error
	for k, v := range props {
		switch {
		case strings.Contains(k, ":"):
			e.ds.User[k] = v
		case k == "quota" || k == "refquota":
			n, err := strconv.ParseUint(v, 10, 64)
			if v == "none" {
				n, err = 0, nil
			}
			if err != nil {
				quotaErr = fmt.Errorf("bad %s %q: %w", k, v, err)
				continue
			}
			if n > 0 && n < e.ds.Used {
				quotaErr = fmt.Errorf("%s %d is below used %d", k, n, e.ds.Used)
				continue
			}
			if k == "quota" {
				e.ds.Quota = n
			} else {
				e.ds.RefQuota = n
			}
			e.props[k] = v
		case k == "readonly":
			e.ds.ReadOnly = v == "on"
			e.props[k] = v
		default:
			e.props[k] = v
		}
	}
	return quotaErr
}

func (f *Fake) CreateFilesystem(ctx context.Context, name string, props map[string]string) error {
	unlock, err := f.enter("create", name)
	if err != nil {
		return err
	}
	defer unlock()
	if strings.Contains(name, "@") {
		return fmt.Errorf("create %s: a snapshot name", name)
	}
	return f.create(name, zfs.Filesystem, "", props)
}

func (f *Fake) Snapshot(ctx context.Context, name string, props map[string]string) error {
	unlock, err := f.enter("snapshot", name)
	if err != nil {
		return err
	}
	defer unlock()
	if !strings.Contains(name, "@") {
		return fmt.Errorf("snapshot %s: not a snapshot name", name)
	}
	if err := f.create(name, zfs.Snapshot, "", props); err != nil {
		return err
	}
	fs, snap := f.datasets[zfs.Parent(name)], f.datasets[name]
	snap.ds.Referenced = fs.ds.Referenced
	snap.content = slices.Clone(fs.content) // frozen from now on
	return nil
}

func (f *Fake) Clone(ctx context.Context, snapshot, name string, props map[string]string) error {
	unlock, err := f.enter("clone", name)
	if err != nil {
		return err
	}
	defer unlock()
	_, err = f.createFrom(snapshot, name, snapshot, props)
	return err
}

// createFrom creates filesystem name holding snapshot's content, with
// origin (the snapshot for a clone, "" for a received copy), under the
// caller's lock. The encryption property cannot be given: a clone and a
// raw copy both keep their source's.
func (f *Fake) createFrom(snapshot, name, origin string, props map[string]string) (*entry, error) {
	s, ok := f.datasets[snapshot]
	if !ok || s.ds.Type != zfs.Snapshot {
		return nil, fmt.Errorf("source snapshot %s: %w", snapshot, zfs.ErrNotFound)
	}
	if _, ok := props["encryption"]; ok {
		return nil, fmt.Errorf("cannot create '%s': 'encryption' is readonly", name)
	}
	if err := f.create(name, zfs.Filesystem, origin, props); err != nil {
		return nil, err
	}
	e := f.datasets[name]
	e.content = slices.Clone(s.content)
	return e, nil
}

func (f *Fake) SetProperties(ctx context.Context, name string, props map[string]string) error {
	for k := range props {
		if createOnlyProps[k] {
			return fmt.Errorf("zfs set %s: '%s' is readonly", name, k)
		}
	}
	return f.onDataset("set", name, func(e *entry) error { return setProps(e, props) })
}

// createOnlyProps are set when a filesystem is created (or received) and
// never after.
var createOnlyProps = map[string]bool{"encryption": true, "normalization": true, "casesensitivity": true, "utf8only": true}

func (f *Fake) Rename(ctx context.Context, from, to string) error {
	unlock, err := f.enter("rename", from)
	if err != nil {
		return err
	}
	defer unlock()
	if _, ok := f.datasets[from]; !ok {
		return fmt.Errorf("%s: %w", from, zfs.ErrNotFound)
	}
	if _, ok := f.datasets[to]; ok {
		return fmt.Errorf("%s: %w", to, zfs.ErrExists)
	}
	if err := zfs.ValidateName(to); err != nil {
		return err
	}
	isSnap := strings.Contains(from, "@")
	if isSnap != strings.Contains(to, "@") || isSnap && zfs.Parent(from) != zfs.Parent(to) || strings.HasPrefix(to, from+"/") {
		return fmt.Errorf("rename %s to %s: not a rename ZFS allows", from, to)
	}
	if p, ok := f.datasets[zfs.Parent(to)]; !ok || p.ds.Type != zfs.Filesystem {
		return fmt.Errorf("parent of %s: %w", to, zfs.ErrNotFound)
	}
	// The whole entries move, so snapshots keep their GUIDs, holds and
	// content.
	for _, n := range f.tree(from) {
		e := f.datasets[n]
		delete(f.datasets, n)
		e.ds.Name = to + n[len(from):]
		f.datasets[e.ds.Name] = e
	}
	for _, e := range f.datasets { // clones follow their origin's new name
		if o := e.ds.Origin; strings.HasPrefix(o, from+"@") || strings.HasPrefix(o, from+"/") {
			e.ds.Origin = to + e.ds.Origin[len(from):]
		}
	}
	return nil
}

func (f *Fake) Destroy(ctx context.Context, name string) error {
	return f.destroy(name, false)
}

func (f *Fake) DestroyDeferred(ctx context.Context, name string) error {
	return f.destroy(name, true)
}

// destroy is zfs destroy name, or with deferred zfs destroy -d
// (snapshots only): a snapshot that still has clones is marked, and goes
// with its last clone.
func (f *Fake) destroy(name string, deferred bool) error {
	unlock, err := f.enter("destroy", name)
	if err != nil {
		return err
	}
	defer unlock()
	if deferred && !strings.Contains(name, "@") {
		return fmt.Errorf("deferred destroy of %s: only snapshots", name)
	}
	e, ok := f.datasets[name]
	if !ok {
		return fmt.Errorf("%s: %w", name, zfs.ErrNotFound)
	}
	for n := range f.datasets {
		if strings.HasPrefix(n, name+"/") || strings.HasPrefix(n, name+"@") {
			return fmt.Errorf("destroy %s: %s depends on it: %w", name, n, zfs.ErrHasDependents)
		}
	}
	if len(e.holds) > 0 {
		return fmt.Errorf("destroy %s: held by %v: %w", name, e.holds, zfs.ErrBusy)
	}
	if clones := f.clonesOf(name); len(clones) > 0 {
		if deferred {
			e.ds.DeferDestroy = true
			return nil
		}
		return fmt.Errorf("destroy %s: clones %v: %w", name, clones, zfs.ErrHasDependents)
	}
	origin := e.ds.Origin
	delete(f.datasets, name)
	// A deferred snapshot goes with its last clone, as in ZFS.
	if o, ok := f.datasets[origin]; ok && o.ds.DeferDestroy && len(f.clonesOf(origin)) == 0 {
		delete(f.datasets, origin)
	}
	return nil
}

func (f *Fake) clonesOf(snapshot string) []string {
	var out []string
	for n, e := range f.datasets {
		if e.ds.Origin == snapshot {
			out = append(out, n)
		}
	}
	return out
}

func (f *Fake) PoolHealth(ctx context.Context, pool string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.datasets[pool]; !ok {
		return fmt.Errorf("pool %s is not imported: %w", pool, zfs.ErrUnavailable)
	}
	if f.Fail != nil {
		return f.Fail("pool", pool)
	}
	return nil
}
