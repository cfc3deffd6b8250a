package faultsim

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/scheduler"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// checker asserts the invariants of docs/safety.md against the real state
// of every node's pool and mount table, whatever the processes believe:
//
//	I1  at most one copy of a volume is mounted writable;
//	I2, I4  every write a job saw succeed is still in some dataset or
//	    snapshot of the volume on some node, until the volume is deleted
//	    (so nothing acknowledged is lost and no copy holding the only
//	    instance of a write was destroyed);
//	I3  a copy's generation never goes down while it lives (a copy
//	    removed and received again is another), and no two copies are ever
//	    primary at one generation (but for one the operator forced:
//	    generationsGrow).
//
// Besides: a stage that succeeds mounts the newest primary of the volume
// on any node, down or not (a job never gets a stale copy: what it wrote
// on a newer one would seem lost to it, and it would write a second
// history); a mounted dataset is never renamed or destroyed under its
// mount; and once DeleteVolume answered OK no copy is left on any node,
// down or not.
//
//	I5  no copy changes on a node without its copy's lock (package
//	    copylock): the one owner of a copy's life. Checked at every
//	    change, in the pool wrapper (lockedChange).
//
// And a replica of the primary's own generation never holds, as its
// newest, a replication snapshot the primary lacks (replicasFollow).
//
// And each live node's index of its primaries agrees with its pool
// (indexAgrees), and so does what the schedule's book keeps of the node's
// primaries while the node reports the version the book saw (bookAgrees,
// after each round).
type checker struct {
	w *world
	// writes: by volume ID, the token of every write that succeeded.
	writes map[string][]string
	// deletingIDs: volumes whose delete began; what it destroys is meant.
	deletingIDs map[string]bool
	// generations: the last generation seen of each copy, by node and ID.
	generations map[string]uint64
	// primaries: by volume ID and generation, the node first seen primary.
	primaries map[string]string
	// forced: by volume ID and generation, the generations first seen on
	// a primary the operator's promote -force marked (generationsGrow).
	forced map[string]bool
	// ahead: by node and volume ID, the replication snapshot a replica
	// held as its newest, of the primary's generation, while the primary
	// lacked it, at the last check (replicasFollow).
	ahead map[string]string
	// pending is a violation found between checks.
	pending error
	// unlocked is the first change of a copy made without its lock (I5),
	// recorded from whichever goroutine made it.
	unlocked atomic.Pointer[error]
}

func newChecker(w *world) *checker {
	return &checker{w: w, writes: map[string][]string{}, deletingIDs: map[string]bool{},
		generations: map[string]uint64{}, primaries: map[string]string{}, forced: map[string]bool{}, ahead: map[string]string{}}
}

func volumeOf(dataset string) string {
	id := strings.TrimPrefix(dataset, rootDataset+"/")
	id, _, _ = strings.Cut(id, "@")
	return id
}

func (c *checker) acked(dataset, token string) {
	id := volumeOf(dataset)
	c.writes[id] = append(c.writes[id], token)
}

func (c *checker) created(id string) { delete(c.deletingIDs, id) }

func (c *checker) deleting(id string) { c.deletingIDs[id] = true }

// deleted forgets the volume: a later one of the same name starts anew.
func (c *checker) deleted(id string) {
	delete(c.writes, id)
	for key := range c.generations {
		if strings.HasSuffix(key, "/"+id) {
			delete(c.generations, key)
		}
	}
	for key := range c.ahead {
		if strings.HasSuffix(key, "/"+id) {
			delete(c.ahead, key)
		}
	}
	for key := range c.primaries {
		if strings.HasPrefix(key, id+"@") {
			delete(c.primaries, key)
			delete(c.forced, key)
		}
	}
	for _, n := range c.w.nodes {
		if slices.Contains(n.pool.Names(), rootDataset+"/"+id) {
			c.late(fmt.Errorf("DeleteVolume of %s answered OK, but node %s still holds %s/%s", id, n.id, rootDataset, id))
		}
	}
}

// staged checks, when a stage succeeded, that no node holds a primary of
// the volume newer than the staged copy.
func (c *checker) staged(id, node string) {
	fs := rootDataset + "/" + id
	n := c.w.node(node)
	gen, _ := strconv.ParseUint(c.user(n, fs, copyrecord.PropGeneration), 10, 64)
	for _, m := range c.w.nodes {
		if m == n || !slices.Contains(m.pool.Names(), fs) {
			continue
		}
		if role, g, _ := c.label(m, fs); role == contract.RolePrimary && g > gen {
			c.late(fmt.Errorf("a stale copy was staged: volume %s at generation %d on %s, while %s holds its primary at generation %d", id, gen, node, m.id, g))
		}
	}
}

// late records a violation found outside check, for check to return.
func (c *checker) late(err error) {
	if c.pending == nil {
		c.pending = err
	}
}

func (c *checker) check() error {
	if err := c.pending; err != nil {
		return err
	}
	if err := c.unlocked.Load(); err != nil {
		return *err
	}
	for _, v := range c.w.vols {
		for _, check := range []func(id string) error{c.oneWriter, c.generationsGrow, c.nothingLost, c.mountsStay, c.replicasFollow} {
			if err := check(v.id); err != nil {
				return err
			}
		}
	}
	for _, n := range c.w.nodes {
		if err := c.indexAgrees(n); err != nil {
			return err
		}
	}
	return c.w.snapshotsKept()
}

// indexAgrees checks that a live node's index of its primaries (what
// placement counts and ListVolumes pages through) agrees with a listing
// of its pool, when no change is half done there.
func (c *checker) indexAgrees(n *simNode) error {
	inc := n.inc
	if inc == nil || !inc.isAlive() {
		return nil
	}
	quiet := func() (string, bool) { return inc.volumes.Index().VolumesVersion(), !inc.volumes.Locks().Busy() }
	version, ok := quiet()
	if !ok {
		return nil
	}
	ctx := context.Background()
	listed, err := inc.volumes.List(ctx)
	if err != nil {
		return nil // the process died meanwhile
	}
	capacity, cerr := inc.volumes.Capacity(ctx)
	page, perr := inc.volumes.Index().ListPage(ctx, "", 0)
	if after, ok := quiet(); !ok || after != version || cerr != nil || perr != nil {
		return nil
	}
	var want, got []string
	for _, v := range listed {
		want = append(want, v.ID)
	}
	for _, v := range page {
		got = append(got, v.ID)
	}
	if !slices.Equal(got, want) || capacity.Volumes != len(want) {
		return fmt.Errorf("the index of node %s's primaries is wrong: it pages %v and counts %d, its pool holds %v", n.id, got, capacity.Volumes, want)
	}
	return nil
}

// bookAgrees checks that what the schedule's book keeps of a live node's
// primaries is what its pool holds, while the node reports the volumes
// version the book saw, and no change is half done there: the book
// learns a changed node's primaries from what it tells changed since
// (Changes), and a change it misses would leave a volume unreplicated.
func (c *checker) bookAgrees(sched *scheduler.Scheduler, n *simNode) error {
	inc := n.inc
	if inc == nil || !inc.isAlive() {
		return nil
	}
	booked, version, ok := sched.Held(n.id)
	if !ok || version != inc.volumes.Index().VolumesVersion() || inc.volumes.Locks().Busy() {
		return nil
	}
	listed, err := inc.volumes.List(context.Background())
	if err != nil || version != inc.volumes.Index().VolumesVersion() || inc.volumes.Locks().Busy() {
		return nil // the process died, or a change began meanwhile
	}
	var want []string
	for _, v := range listed {
		want = append(want, v.ID)
	}
	if !slices.Equal(booked, want) {
		return fmt.Errorf("the schedule's book keeps %v as node %s's primaries at its version %s; its pool holds %v", booked, n.id, version, want)
	}
	return nil
}

func (c *checker) user(n *simNode, dataset, prop string) string {
	v, _, _ := n.pool.UserProperty(context.Background(), dataset, prop)
	return v
}

// label reads a copy's role and generation in one read of its dataset. A
// background move's promotion runs beside the checks, and sets both at
// once: read one by one, a copy could show the replica's generation and
// the primary's role (a false I3, seen under load).
func (c *checker) label(n *simNode, dataset string) (role string, gen uint64, err error) {
	ds, err := n.pool.Get(context.Background(), dataset)
	if err != nil {
		return "", 0, err
	}
	gen, err = strconv.ParseUint(ds.User[copyrecord.PropGeneration], 10, 64)
	return ds.User[copyrecord.PropRole], gen, err
}

// oneWriter is I1.
func (c *checker) oneWriter(id string) error {
	fs := rootDataset + "/" + id
	var writable []string
	for _, n := range c.w.nodes {
		if n.mounts.Mounted(fs) && n.pool.NativeProperty(fs, "readonly") != "on" {
			writable = append(writable, fmt.Sprintf("%s (generation %s, role %s)", n.id,
				c.user(n, fs, copyrecord.PropGeneration), c.user(n, fs, copyrecord.PropRole)))
		}
	}
	if len(writable) > 1 {
		return fmt.Errorf("I1 broken: volume %s is mounted writable on %s", id, strings.Join(writable, " and "))
	}
	return nil
}

// generationsGrow is I3. The operator's promote -force gives a
// generation with the grants of the nodes that answer, not a majority's,
// on the operator's word that the silent nodes hold nothing newer
// (docs/safety.md, "Generations"); a majority that never heard of it may
// give the same generation again, which the controller reports as a
// conflict and stages neither. So a generation seen on a primary the
// force marked (copyrecord.PropForced, which a check reads before the
// node's next beat may clear it) is not held to being given once; every
// other part of I3, and I1, holds for it.
func (c *checker) generationsGrow(id string) error {
	fs := rootDataset + "/" + id
	for _, n := range c.w.nodes {
		key := n.id + "/" + id
		if !slices.Contains(n.pool.Names(), fs) {
			// A copy removed (remove-replica, a surplus copy) is gone: a
			// copy received there later is another, from its own first
			// generation.
			delete(c.generations, key)
			continue
		}
		role, gen, err := c.label(n, fs)
		if err != nil {
			continue // a replica being received carries no label yet
		}
		if last := c.generations[key]; gen < last {
			return fmt.Errorf("I3 broken: the copy of %s on %s went from generation %d to %d", id, n.id, last, gen)
		}
		c.generations[key] = gen
		if role != contract.RolePrimary {
			continue
		}
		pkey := fmt.Sprintf("%s@%d", id, gen)
		if c.user(n, fs, copyrecord.PropForced) == strconv.FormatUint(gen, 10) {
			c.forced[pkey] = true
		}
		if first, ok := c.primaries[pkey]; ok && first != n.id && !c.forced[pkey] {
			return fmt.Errorf("I3 broken: generation %d of %s was given to the copies on %s and on %s", gen, id, first, n.id)
		}
		if _, ok := c.primaries[pkey]; !ok {
			c.primaries[pkey] = n.id
		}
	}
	return nil
}

// nothingLost is I2 and I4: every write the job saw succeed is in some
// dataset or snapshot of the volume on some node.
func (c *checker) nothingLost(id string) error {
	if c.deletingIDs[id] {
		return nil
	}
	have := map[string]bool{}
	for _, n := range c.w.nodes {
		for _, name := range n.pool.Names() {
			if !strings.HasPrefix(name, rootDataset+"/"+id) {
				continue
			}
			content, err := n.pool.Content(name)
			if err != nil {
				continue
			}
			for _, t := range content {
				have[t] = true
			}
		}
	}
	for _, t := range c.writes[id] {
		if !have[t] {
			return fmt.Errorf("I2/I4 broken: the write %s to volume %s succeeded, but no dataset or snapshot on any node holds it", t, id)
		}
	}
	return nil
}

// mountsStay: a mounted dataset is never renamed or destroyed (ZFS would
// follow a rename, and the job with it, to a copy set aside).
func (c *checker) mountsStay(id string) error {
	fs := rootDataset + "/" + id
	for _, n := range c.w.nodes {
		if n.mounts.Mounted(fs) && !slices.Contains(n.pool.Names(), fs) {
			return fmt.Errorf("volume %s is mounted on %s, but its dataset %s is gone from under the mount", id, n.id, fs)
		}
	}
	return nil
}

// replicasFollow: no replica of the primary's generation holds, as its
// newest, a replication snapshot the primary lacks (docs/replication.md,
// "A replica is never ahead of its primary's snapshots"): the receiver
// refuses to roll back snapshots of its own generation, so every push to
// it would be refused until the volume's next move. The checks read the
// nodes while their pushes and tidies run, so a replica found ahead once
// may be a read between a receive and the primary's listing; found ahead
// of the same snapshot again at the next check, it is stuck. A volume
// being deleted, and a generation the operator forced (which may have
// two primaries), are left out.
func (c *checker) replicasFollow(id string) error {
	fs := rootDataset + "/" + id
	ctx := context.Background()
	var primary *simNode
	var gen uint64
	for _, n := range c.w.nodes {
		if slices.Contains(n.pool.Names(), fs) {
			if role, g, err := c.label(n, fs); err == nil && role == contract.RolePrimary && g >= gen {
				primary, gen = n, g
			}
		}
	}
	if primary == nil || c.deletingIDs[id] || c.forced[fmt.Sprintf("%s@%d", id, gen)] {
		return nil
	}
	mine, err := primary.pool.Snapshots(ctx, fs)
	if err != nil {
		return nil
	}
	for _, n := range c.w.nodes {
		key := n.id + "/" + id
		newest, ok := c.replicaNewest(n, fs, gen)
		if !ok || slices.ContainsFunc(mine, func(s zfs.Snap) bool { return s.GUID == newest.GUID }) {
			delete(c.ahead, key)
			continue
		}
		if c.ahead[key] == newest.Name {
			return fmt.Errorf("the replica of %s on %s holds %s, of the primary's generation %d, which the primary on %s lacks: every push to it is refused",
				id, n.id, newest.Name, gen, primary.id)
		}
		c.ahead[key] = newest.Name
	}
	return nil
}

// replicaNewest is the newest snapshot of n's replica fs of generation
// gen, when that is a replication snapshot.
func (c *checker) replicaNewest(n *simNode, fs string, gen uint64) (zfs.Snap, bool) {
	if !slices.Contains(n.pool.Names(), fs) {
		return zfs.Snap{}, false
	}
	if role, g, err := c.label(n, fs); err != nil || role != contract.RoleReplica || g != gen {
		return zfs.Snap{}, false
	}
	snaps, err := n.pool.Snapshots(context.Background(), fs)
	if err != nil || len(snaps) == 0 {
		return zfs.Snap{}, false
	}
	newest := snaps[len(snaps)-1]
	if _, ok := contract.ReplicationSnapshotTime(newest.Name); !ok {
		return zfs.Snap{}, false
	}
	return newest, true
}

// changes are the pool operations that change a dataset or snapshot.
var changes = map[string]bool{"create": true, "snapshot": true, "clone": true, "set": true, "rename": true, "destroy": true,
	"release": true, "receive": true, "hold": true, "abort": true, "rollback": true}

// lockedChange records a violation of I5 when op changes a copy on node
// while nobody holds the copy's lock.
func (c *checker) lockedChange(inc *incarnation, op, name string) {
	if !changes[op] || inc.volumes == nil {
		return
	}
	id, ok := copyOf(name)
	if !ok {
		return
	}
	if _, held := inc.volumes.Locks().Held(id); !held {
		err := fmt.Errorf("I5: %s %s on %s without the lock of volume %s's copy", op, name, inc.n.id, id)
		c.unlocked.CompareAndSwap(nil, &err)
	}
}

// copyOf names the volume whose copy name (a dataset or snapshot) belongs
// to: <root>/<id>, its snapshots, and the names a copy takes on its way
// (<id>-incoming, <id>-aside-<nanos>). Tombstones (<id>-deleted-<nanos>)
// are no copy: only a CSI snapshot keeps one.
func copyOf(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, rootDataset+"/")
	if !ok {
		return "", false
	}
	rest, _, _ = strings.Cut(rest, "@")
	const idLen = len("vol-") + 20
	if len(rest) < idLen || !contract.IsVolumeID(rest[:idLen]) || strings.HasPrefix(rest[idLen:], "-deleted-") {
		return "", false
	}
	return rest[:idLen], true
}
