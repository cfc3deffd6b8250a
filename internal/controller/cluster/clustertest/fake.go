package clustertest

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// FakeAgent is a node agent in memory, in the plain types of
// cluster.Agent: no gRPC, no ZFS. It keeps what the controller's logic
// asks about (each volume's copy, the generation promised for it, the
// snapshots and the copies set aside) and follows the agent's rules
// where that logic depends on them: a promise is granted above every
// generation the node knows, or again to the same holder; a demotion
// needs a newer generation; a push (Replicate, MoveFinal) makes the
// target's copy a replica of the primary's generation, holding a
// snapshot taken now; a promotion needs the node's own promise and a
// replica as fresh as the move's fence; an unfence needs no newer
// generation promised to another node. The node is the truth: the
// contract test (internal/testbed/agentcontract) runs one table of the
// node's refusals and answers against this fake and the real node, and
// a rule changed on either side must change the other and the table.
type FakeAgent struct {
	mu        sync.Mutex
	info      agentclient.NodeInfo
	down      bool
	copies    map[string]agentclient.Copy // by volume ID
	sources   map[string]string           // a volume's content source, "snapshot:ID" or "volume:ID"
	snapshots map[string]agentclient.Snapshot
	deleted   map[string]agentclient.Snapshot // records of deleted snapshots, by ID
	receiving map[string]bool                 // volumes a receive runs into (Receiving)
	setAside  []string
	refusals  map[string]refusal // by method name
	before    map[string]func()  // by method name, run once (BeforeCall)
	calls     []string
	purposes  []string             // of the Replicate calls, in order
	pushedTo  []agentclient.Target // of the Replicate calls, in order
	creates   []agentclient.NewVolume
	reserved  []agentclient.Reservation
	world     *Fakes // the node's peers, when it was made by Fakes.Add
	// changed logs the volume of every change of a copy (the node's
	// volumes version is its length), for Changes; mute makes Changes
	// answer that the node cannot tell, as an older node does.
	changed []string
	mute    bool
	// demoted: when each replica demoted by a move was, as the node
	// marks it (copyrecord.PropDemotedAt).
	demoted map[string]time.Time
	// BeforePush, when set, runs before each push (Replicate, MoveFinal)
	// of the node, outside its lock; an error is the push's answer.
	BeforePush func(ctx context.Context, volumeID string, each func(agentclient.Progress)) error
	// BeforeCreate, when set, runs before each CreateVolume with the
	// call's context, outside the node's lock: a node whose pool is slow
	// to write. An error is the create's answer.
	BeforeCreate func(ctx context.Context) error
	// workLease is the node's part of the work lease, granting at once.
	workLease *worklease.Grants
	// pushing holds each volume's push that BeforePush holds: Status
	// lists it as a transfer, and another push of the volume meanwhile
	// is refused, as a node refuses a second transfer of one copy.
	pushing map[string]*agentclient.Transfer
}

// NewFakeAgent returns the agent of a node that holds nothing.
func NewFakeAgent(info agentclient.NodeInfo) *FakeAgent {
	return &FakeAgent{
		info:      info,
		copies:    map[string]agentclient.Copy{},
		sources:   map[string]string{},
		snapshots: map[string]agentclient.Snapshot{},
		deleted:   map[string]agentclient.Snapshot{},
		receiving: map[string]bool{},
		refusals:  map[string]refusal{},
		before:    map[string]func(){},
		demoted:   map[string]time.Time{},
		workLease: worklease.NewGrantsAtOnce(time.Now),
		pushing:   map[string]*agentclient.Transfer{},
	}
}

// SetAwaited sets the stages the node reports waiting for a move's
// promotion (NodeInfo.AwaitedPromotions).
func (f *FakeAgent) SetAwaited(awaited []agentclient.AwaitedPromotion) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.info.AwaitedPromotions = awaited
}

var _ cluster.NodeAgent = (*FakeAgent)(nil)

// PutCopy gives the node a copy of a volume (its NodeID is the node's).
func (f *FakeAgent) PutCopy(c agentclient.Copy) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c.NodeID, c.Exists = f.info.NodeID, true
	f.setCopy(c)
}

// PutPrimary gives the node the primary of volume name at generation.
func (f *FakeAgent) PutPrimary(name string, generation uint64) string {
	id := contract.VolumeIDForName(name)
	f.PutCopy(agentclient.Copy{VolumeID: id, Name: name, Role: contract.RolePrimary, Generation: generation, CapacityBytes: 1 << 30})
	return id
}

// PutReplica gives the node a replica of volume name at generation.
func (f *FakeAgent) PutReplica(name string, generation uint64) string {
	id := contract.VolumeIDForName(name)
	f.PutCopy(agentclient.Copy{VolumeID: id, Name: name, Role: contract.RoleReplica, Generation: generation, CapacityBytes: 1 << 30})
	return id
}

// Promise records that the node promised generation of volume id to holder.
func (f *FakeAgent) Promise(id string, generation uint64, holder string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.copies[id]
	if !c.Exists {
		c = agentclient.Copy{VolumeID: id, NodeID: f.info.NodeID}
	}
	c.PromisedGeneration, c.PromisedHolder = generation, holder
	f.copies[id] = c
}

// Copy returns the node's copy of volume id, if it holds one.
func (f *FakeAgent) Copy(id string) (agentclient.Copy, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.copies[id]
	return c, c.Exists
}

// SetAside returns the IDs of the volumes whose copies were set aside.
func (f *FakeAgent) SetAside() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.setAside...)
}

// refusal is what a refused method answers, and how many more times
// (times < 0: until the test says otherwise).
type refusal struct {
	err   error
	times int
}

// Refuse makes every later call of method (a cluster.Agent method name)
// answer err; nil answers normally again.
func (f *FakeAgent) Refuse(method string, err error) {
	f.RefuseTimes(method, -1, err)
}

// RefuseTimes makes the next n calls of method answer err (all later
// ones for n < 0); the calls after them answer normally.
func (f *FakeAgent) RefuseTimes(method string, n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil || n == 0 {
		delete(f.refusals, method)
		return
	}
	f.refusals[method] = refusal{err: err, times: n}
}

// BeforeCall runs fn once, at the next call of method (a cluster.Agent
// method name), before the call does anything: other work landing on the
// node at that moment. fn runs outside the node's lock.
func (f *FakeAgent) BeforeCall(method string, fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.before[method] = fn
}

// SetDown makes the node answer nothing (every call Unavailable), as a
// node that is off; false brings it back.
func (f *FakeAgent) SetDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

// Calls returns the calls the node answered or refused, "Method ID" (or
// "Method" for a call about no one volume), oldest first.
func (f *FakeAgent) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// enter records a call and returns the error it answers instead of its
// work: the node is down, or the test made it refuse method. The caller
// holds f.mu.
func (f *FakeAgent) enter(method, id string) error {
	call := method
	if id != "" {
		call += " " + id
	}
	f.calls = append(f.calls, call)
	if fn, ok := f.before[method]; ok {
		delete(f.before, method)
		f.mu.Unlock() // fn may call this node
		fn()
		f.mu.Lock()
	}
	if f.down {
		return errdefs.Wrap(errdefs.ErrUnavailable, "node %s is down", f.info.NodeID)
	}
	r, ok := f.refusals[method]
	if !ok {
		return nil
	}
	if r.times > 0 {
		r.times--
		f.refusals[method] = r
		if r.times == 0 {
			delete(f.refusals, method)
		}
	}
	return r.err
}

func (f *FakeAgent) GetNode(_ context.Context, opts agentclient.GetNodeOptions) (agentclient.NodeInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("GetNode", ""); err != nil {
		return agentclient.NodeInfo{}, err
	}
	info := f.info
	info.VolumesVersion = f.version()
	// A node that keeps no lease always holds it (a real node without
	// peers answers so); one that keeps a lease and counts no node yet
	// has just started (cluster.starting): a test sets KnownNodes to
	// give it a lease.
	info.LeaseHeld = info.LeaseHeld || info.KnownNodes == 0
	if opts.WithoutHealth { // as a node answers: its health not read
		info.UnhealthyReason = ""
	}
	if opts.WithoutCapacity || opts.WithoutHealth {
		info.AvailableBytes, info.Volumes = 0, 0
		return info, nil
	}
	for _, c := range f.copies {
		if c.Exists && c.Role == contract.RolePrimary {
			info.Volumes++
		}
	}
	return info, nil
}

// primary returns the node's primary of volume id, or NotFound. The caller
// holds f.mu.
func (f *FakeAgent) primary(id string) (agentclient.Copy, error) {
	c := f.copies[id]
	if !c.Exists || c.Role != contract.RolePrimary {
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrNotFound, "node %s holds no primary of volume %s", f.info.NodeID, id)
	}
	return c, nil
}

// enterPrimary is enter, then primary: the call method on volume id,
// answered from the node's primary. The caller holds f.mu.
func (f *FakeAgent) enterPrimary(method, id string) (agentclient.Copy, error) {
	if err := f.enter(method, id); err != nil {
		return agentclient.Copy{}, err
	}
	return f.primary(id)
}

func (f *FakeAgent) volume(c agentclient.Copy) agentclient.Volume {
	return agentclient.Volume{
		VolumeID:             c.VolumeID,
		Name:                 c.Name,
		CapacityBytes:        c.CapacityBytes,
		Parameters:           c.Parameters,
		Source:               f.sources[c.VolumeID],
		NodeID:               f.info.NodeID,
		Generation:           c.Generation,
		MovingTo:             c.MovingTo,
		FailoverFromSnapshot: c.FailoverFromSnapshot,
	}
}

// CreateVolume creates the primary of generation 1 (or of the one the
// node promised itself, as a node does), or answers the primary of that
// name the node holds already.
func (f *FakeAgent) CreateVolume(ctx context.Context, v agentclient.NewVolume) (agentclient.Volume, error) {
	id := contract.VolumeIDForName(v.Name)
	f.mu.Lock()
	hook := f.BeforeCreate
	f.mu.Unlock()
	if hook != nil {
		if err := hook(ctx); err != nil {
			return agentclient.Volume{}, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("CreateVolume", id); err != nil {
		return agentclient.Volume{}, err
	}
	f.creates = append(f.creates, v)
	if c, ok := f.copies[id]; ok && c.Exists {
		if c.Role != contract.RolePrimary {
			return agentclient.Volume{}, errdefs.Wrap(errdefs.ErrAlreadyExists, "node %s holds a %s of volume %s", f.info.NodeID, c.Role, id)
		}
		// As a real node, a repeated create must name the same source.
		if src := sourceOf(v); f.sources[id] != src {
			return agentclient.Volume{}, errdefs.Wrap(errdefs.ErrAlreadyExists, "volume %q exists with source %q, not %q", v.Name, f.sources[id], src)
		}
		return f.volume(c), nil
	}
	if v.RequiredBytes > f.info.AvailableBytes {
		return agentclient.Volume{}, errdefs.Wrap(errdefs.ErrResourceExhausted, "node %s has %d bytes free, not %d", f.info.NodeID, f.info.AvailableBytes, v.RequiredBytes)
	}
	size := max(v.RequiredBytes, 1<<30)
	c := f.copies[id] // keeps the promise
	if c.PromisedHolder == contract.DeletionHolder {
		return agentclient.Volume{}, errdefs.Wrap(errdefs.ErrAborted, "volume %s is being deleted", id)
	}
	c.VolumeID, c.NodeID, c.Exists, c.Name = id, f.info.NodeID, true, v.Name
	c.Role, c.Generation, c.CapacityBytes, c.Parameters = contract.RolePrimary, max(c.PromisedGeneration, 1), size, v.Parameters
	f.setCopy(c)
	if src := sourceOf(v); src != "" {
		f.sources[id] = src
	}
	f.info.AvailableBytes -= size
	return f.volume(c), nil
}

// sourceOf is what a node records as a new volume's source.
func sourceOf(v agentclient.NewVolume) string {
	switch {
	case v.SourceSnapshotID != "":
		return "snapshot:" + v.SourceSnapshotID
	case v.SourceVolumeID != "":
		return "volume:" + v.SourceVolumeID
	}
	return ""
}

// DeleteVolume destroys the node's primary of volume id, if it holds one.
func (f *FakeAgent) DeleteVolume(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("DeleteVolume", id); err != nil {
		return err
	}
	if _, err := f.primary(id); err == nil {
		f.forget(id)
	}
	return nil
}

// forget drops the copy of volume id and keeps its promise. The caller
// holds f.mu.
func (f *FakeAgent) forget(id string) {
	delete(f.demoted, id)
	c := f.copies[id]
	f.setCopy(agentclient.Copy{VolumeID: id, NodeID: f.info.NodeID, PromisedGeneration: c.PromisedGeneration, PromisedHolder: c.PromisedHolder})
}

// setCopy sets the node's copy of a volume, a change of the node's
// volumes. The caller holds f.mu.
func (f *FakeAgent) setCopy(c agentclient.Copy) {
	f.copies[c.VolumeID] = c
	f.changed = append(f.changed, c.VolumeID)
}

// version is the node's volumes version. The caller holds f.mu.
func (f *FakeAgent) version() string {
	return fmt.Sprintf("fake-%d", len(f.changed))
}

// SetTellsChanges makes the node answer Changes (the default) or not, as
// a node older than the call.
func (f *FakeAgent) SetTellsChanges(tells bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mute = !tells
}

// Changes tells what became of each volume whose copy changed since the
// node reported volumes version since.
func (f *FakeAgent) Changes(_ context.Context, since string) (agentclient.Changes, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Changes", ""); err != nil {
		return agentclient.Changes{}, err
	}
	var seen int
	if _, err := fmt.Sscanf(since, "fake-%d", &seen); err != nil || f.mute || seen > len(f.changed) {
		return agentclient.Changes{}, nil
	}
	out := agentclient.Changes{Known: true}
	for _, id := range f.changed[seen:] {
		if slices.Contains(out.VolumeIDs, id) {
			continue
		}
		out.VolumeIDs = append(out.VolumeIDs, id)
		switch c := f.copies[id]; {
		case c.Exists && c.Role == contract.RolePrimary:
			out.Volumes = append(out.Volumes, f.volume(c))
		case c.Exists && c.Role == contract.RoleReplica:
			out.Replicas = append(out.Replicas, f.replicaOf(c))
		}
	}
	return out, nil
}

// replicaOf is what Status tells of replica c. The caller holds f.mu.
func (f *FakeAgent) replicaOf(c agentclient.Copy) agentclient.Replica {
	r := agentclient.Replica{VolumeID: c.VolumeID, Name: c.Name, LastSnapshot: c.LastSnapshot,
		LastSnapshotUnix: c.LastSnapshotUnixNano / int64(time.Second), Resumable: c.Resumable}
	if at, ok := f.demoted[c.VolumeID]; ok {
		r.DemotedAtUnix = at.Unix()
	}
	return r
}

// MarkDemoted marks the node's replica of volume id as demoted from
// primary by a move at time at, as Demote does (at the wall clock's now).
func (f *FakeAgent) MarkDemoted(id string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.demoted[id] = at
}

// DeleteSurplus deletes the node's replica of volume id as a surplus
// copy, with the node's checks: demoted by a move, newest still its
// newest snapshot, no receive to resume, no CSI snapshot of the volume
// here but those in elsewhere (FailedPrecondition otherwise).
func (f *FakeAgent) DeleteSurplus(_ context.Context, id, newest string, elsewhere []string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("DeleteSurplus", id); err != nil {
		return false, err
	}
	c := f.copies[id]
	if !c.Exists || c.Role != contract.RoleReplica {
		return false, nil
	}
	if _, demoted := f.demoted[id]; !demoted || c.LastSnapshot != newest || c.Resumable {
		return false, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s keeps its replica of volume %s: not a surplus copy whose newest snapshot is %s", f.info.NodeID, id, newest)
	}
	for _, s := range f.snapshots {
		if s.SourceVolumeID == id && !slices.Contains(elsewhere, s.SnapshotID) {
			return false, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s keeps its replica of volume %s: it holds snapshot %s, which may exist nowhere else", f.info.NodeID, id, s.SnapshotID)
		}
	}
	for sid, s := range f.snapshots {
		if s.SourceVolumeID == id {
			delete(f.snapshots, sid)
		}
	}
	f.forget(id)
	return true, nil
}

func (f *FakeAgent) GetVolume(_ context.Context, id string) (agentclient.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.enterPrimary("GetVolume", id)
	if err != nil {
		return agentclient.Volume{}, err
	}
	return f.volume(c), nil
}

// ListVolumes lists the node's primaries by ID, a page of them as asked.
func (f *FakeAgent) ListVolumes(_ context.Context, page agentclient.Page) ([]agentclient.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("ListVolumes", ""); err != nil {
		return nil, err
	}
	var out []agentclient.Volume
	for _, c := range f.copies {
		if c.Exists && c.Role == contract.RolePrimary && c.VolumeID >= page.From {
			out = append(out, f.volume(c))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].VolumeID < out[j].VolumeID })
	if page.MaxEntries > 0 && len(out) > int(page.MaxEntries) {
		out = out[:page.MaxEntries]
	}
	return out, nil
}

// ExpandVolume raises the primary's capacity to requiredBytes.
func (f *FakeAgent) ExpandVolume(_ context.Context, id string, requiredBytes, _ uint64) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, err := f.enterPrimary("ExpandVolume", id)
	if err != nil {
		return 0, err
	}
	c.CapacityBytes = max(c.CapacityBytes, requiredBytes)
	f.copies[id] = c
	return c.CapacityBytes, nil
}

func (f *FakeAgent) CreateSnapshot(_ context.Context, sourceVolumeID, name string, createdAfterUnix int64) (agentclient.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.enterPrimary("CreateSnapshot", sourceVolumeID); err != nil {
		return agentclient.Snapshot{}, err
	}
	s := agentclient.Snapshot{SnapshotID: contract.SnapshotIDForName(name), Name: name, SourceVolumeID: sourceVolumeID,
		CreatedUnix: max(time.Now().Unix(), createdAfterUnix+1), NodeID: f.info.NodeID}
	f.snapshots[s.SnapshotID] = s
	return s, nil
}

// PutSnapshot gives the node a copy of snapshot s, as replication does
// on a replica of its volume; like a node's receive, it drops a copy the
// node's record of the snapshot's deletion covers.
func (f *FakeAgent) PutSnapshot(s agentclient.Snapshot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, ok := f.deleted[s.SnapshotID]; ok && s.CreatedUnix <= d.CreatedUnix {
		return
	}
	s.NodeID = f.info.NodeID
	f.snapshots[s.SnapshotID] = s
}

// Receiving marks a receive into the node's copy of volumeID as running
// (on) or ended: meanwhile the node keeps its records of that volume's
// deleted snapshots, as a node does while the receive holds the copy's
// lock.
func (f *FakeAgent) Receiving(volumeID string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.receiving[volumeID] = on
}

// HasSnapshot tells whether the node holds a copy of snapshot id.
func (f *FakeAgent) HasSnapshot(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.snapshots[id]
	return ok
}

// DeleteSnapshot deletes the node's copy (only one created up to
// d.CreatedUpToUnix, when set), remembering the deletion first or
// forgetting it last as d asks, as the node agent does.
func (f *FakeAgent) DeleteSnapshot(_ context.Context, d agentclient.SnapshotDeletion) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("DeleteSnapshot", d.SnapshotID); err != nil {
		return err
	}
	if d.Remember {
		if old, ok := f.deleted[d.SnapshotID]; !ok || old.CreatedUnix < d.CreatedUpToUnix {
			f.deleted[d.SnapshotID] = agentclient.Snapshot{SnapshotID: d.SnapshotID, SourceVolumeID: d.SourceVolumeID,
				CreatedUnix: d.CreatedUpToUnix, NodeID: f.info.NodeID, Deleted: true}
		}
	}
	if s, ok := f.snapshots[d.SnapshotID]; ok && (d.CreatedUpToUnix == 0 || s.CreatedUnix <= d.CreatedUpToUnix) {
		delete(f.snapshots, d.SnapshotID)
	}
	if r, ok := f.deleted[d.SnapshotID]; ok && d.Forget {
		if f.receiving[r.SourceVolumeID] {
			return fmt.Errorf("%w: node %s keeps the record of deleted snapshot %s while a receive into volume %s runs", errdefs.ErrAborted, f.info.NodeID, d.SnapshotID, r.SourceVolumeID)
		}
		delete(f.deleted, d.SnapshotID)
	}
	return nil
}

// Remembers tells whether the node holds a record that snapshot id is
// deleted.
func (f *FakeAgent) Remembers(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.deleted[id]
	return ok
}

// ListSnapshots lists the node's snapshots by ID, as q selects them, and
// its records of deleted ones when q asks.
func (f *FakeAgent) ListSnapshots(_ context.Context, q agentclient.SnapshotQuery) ([]agentclient.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("ListSnapshots", q.SnapshotID); err != nil {
		return nil, err
	}
	selected := func(s agentclient.Snapshot) bool {
		return (q.SnapshotID == "" || s.SnapshotID == q.SnapshotID) &&
			(q.SourceVolumeID == "" || s.SourceVolumeID == q.SourceVolumeID)
	}
	var out []agentclient.Snapshot
	for _, s := range f.snapshots {
		if !q.DeletedOnly && selected(s) && s.SnapshotID >= q.From {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SnapshotID < out[j].SnapshotID })
	if q.MaxEntries > 0 && len(out) > int(q.MaxEntries) {
		out = out[:q.MaxEntries]
	}
	if q.WithDeleted || q.DeletedOnly {
		for _, d := range f.deleted {
			if selected(d) {
				out = append(out, d)
			}
		}
	}
	return out, nil
}

// Status reports the node's replicas and the copies it set aside.
func (f *FakeAgent) Status(context.Context) (agentclient.NodeStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Status", ""); err != nil {
		return agentclient.NodeStatus{}, err
	}
	st := agentclient.NodeStatus{SetAside: append([]string(nil), f.setAside...)}
	for _, t := range f.pushing {
		st.Transfers = append(st.Transfers, *t)
	}
	sort.Slice(st.Transfers, func(i, j int) bool { return st.Transfers[i].VolumeID < st.Transfers[j].VolumeID })
	for _, c := range f.copies {
		if c.Exists && c.Role == contract.RoleReplica {
			st.Replicas = append(st.Replicas, f.replicaOf(c))
		}
	}
	sort.Slice(st.Replicas, func(i, j int) bool { return st.Replicas[i].VolumeID < st.Replicas[j].VolumeID })
	return st, nil
}

// DeleteReplica destroys the node's replica of volume id and reports
// whether it held one.
func (f *FakeAgent) DeleteReplica(_ context.Context, id string, volumeDeleted bool) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("DeleteReplica", id); err != nil {
		return false, err
	}
	if c, ok := f.copies[id]; ok && volumeDeleted { // the node forgets the volume's promise first
		c.PromisedGeneration, c.PromisedHolder = 0, ""
		f.copies[id] = c
	}
	if c := f.copies[id]; !c.Exists || c.Role != contract.RoleReplica {
		return false, nil
	}
	f.forget(id)
	return true, nil
}

func (f *FakeAgent) GetCopy(_ context.Context, id string) (agentclient.Copy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("GetCopy", id); err != nil {
		return agentclient.Copy{}, err
	}
	return f.copyOf(id), nil
}

// Demote retires the node's primary, older than generation and not
// mounted: a primary fenced for a move becomes a replica of generation,
// any other (or any when Aside) is set aside (gone from the node's
// copies, listed by SetAside), as the node does. As the node, a demotion
// that finds no copy (set aside already) or a replica (demoted already)
// is done, and answers the copy as it is.
func (f *FakeAgent) Demote(_ context.Context, d agentclient.Demotion) (agentclient.Copy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Demote", d.VolumeID); err != nil {
		return agentclient.Copy{}, err
	}
	c := f.copies[d.VolumeID]
	switch {
	case !c.Exists || c.Role == contract.RoleReplica:
		return f.copyOf(d.VolumeID), nil
	case c.Generation >= d.Generation:
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s holds generation %d of volume %s, not older than %d", f.info.NodeID, c.Generation, d.VolumeID, d.Generation)
	case c.Mounted:
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is mounted on node %s while generation %d is the primary elsewhere; unmount it: it is stale", d.VolumeID, f.info.NodeID, d.Generation)
	}
	if d.Aside || c.MovingTo == "" {
		f.setAside = append(f.setAside, d.VolumeID)
		f.forget(d.VolumeID)
		return f.copyOf(d.VolumeID), nil
	}
	c.Role, c.Generation, c.MovingTo, c.FencedUnixNano = contract.RoleReplica, d.Generation, "", 0
	f.demoted[d.VolumeID] = time.Now()
	f.setCopy(c)
	return c, nil
}

// copyOf is the node's copy of volume id as GetCopy answers it, also when
// it holds none. The caller holds f.mu.
func (f *FakeAgent) copyOf(id string) agentclient.Copy {
	c, ok := f.copies[id]
	if !ok {
		return agentclient.Copy{VolumeID: id, NodeID: f.info.NodeID}
	}
	return c
}

// Reserve grants a generation above every one the node promised or holds
// a copy of, and again to the same holder; else it answers what stands in
// the way. As the node, a grant answers the record it supersedes, and a
// reservation without a generation or a holder is invalid.
func (f *FakeAgent) Reserve(_ context.Context, r agentclient.Reservation) (agentclient.Promise, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reserved = append(f.reserved, r)
	if err := f.enter("Reserve", r.VolumeID); err != nil {
		return agentclient.Promise{}, err
	}
	if r.Generation == 0 || r.HolderNodeID == "" {
		return agentclient.Promise{}, errdefs.Wrap(errdefs.ErrInvalidArgument, "reserving a generation of volume %s needs a generation and a holder", r.VolumeID)
	}
	c := f.copies[r.VolumeID]
	if r.Failover && c.Exists && c.Role == contract.RolePrimary { // as volume.Records.ReserveForFailover
		return agentclient.Promise{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s holds the primary of volume %s (generation %d): no failover is granted while it does", f.info.NodeID, r.VolumeID, c.Generation)
	}
	if c.PromisedGeneration == r.Generation && c.PromisedHolder == r.HolderNodeID {
		return agentclient.Promise{Granted: true, PromisedGeneration: r.Generation, PromisedHolder: r.HolderNodeID}, nil
	}
	if c.PromisedHolder == contract.DeletionHolder { // as volume.Records.Reserve
		granted := r.HolderNodeID == contract.DeletionHolder && r.Generation <= c.PromisedGeneration
		return agentclient.Promise{Granted: granted, PromisedGeneration: c.PromisedGeneration, PromisedHolder: c.PromisedHolder}, nil
	}
	known := agentclient.Promise{PromisedGeneration: c.PromisedGeneration, PromisedHolder: c.PromisedHolder}
	if c.Exists && c.Generation > known.PromisedGeneration {
		known = agentclient.Promise{PromisedGeneration: c.Generation, PromisedHolder: f.info.NodeID}
	}
	if r.Generation <= known.PromisedGeneration {
		return known, nil
	}
	before := agentclient.Promise{Granted: true, PromisedGeneration: c.PromisedGeneration, PromisedHolder: c.PromisedHolder}
	if !c.Exists {
		c = agentclient.Copy{VolumeID: r.VolumeID, NodeID: f.info.NodeID}
	}
	c.PromisedGeneration, c.PromisedHolder = r.Generation, r.HolderNodeID
	f.copies[r.VolumeID] = c
	return before, nil
}

// Reservations returns the Reserve calls the node got, in order.
func (f *FakeAgent) Reservations() []agentclient.Reservation {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reserved)
}

// Replicate pushes the node's primary to the agent at to.Addr: a
// snapshot taken now arrives there as a replica of
// the primary's generation, unless the target holds a primary. A target
// that is no fake of the same Fakes receives nothing; the push answers
// done all the same.
func (f *FakeAgent) Replicate(ctx context.Context, id string, to agentclient.Target, purpose string, each func(agentclient.Progress)) (agentclient.Progress, error) {
	f.mu.Lock()
	f.purposes = append(f.purposes, purpose)
	f.pushedTo = append(f.pushedTo, to)
	f.mu.Unlock()
	if err := f.beforePush(ctx, id, to.Addr, purpose, each); err != nil {
		return agentclient.Progress{}, err
	}
	f.mu.Lock()
	if err := f.enter("Replicate", id); err != nil {
		f.mu.Unlock()
		return agentclient.Progress{}, err
	}
	p, err := f.push(id, to.Addr)
	if err == nil && each != nil {
		each(p)
	}
	return p, err
}

// Creates returns the requests of the node's CreateVolume calls, in order.
func (f *FakeAgent) Creates() []agentclient.NewVolume {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.creates)
}

// PushedTo returns the targets the node's Replicate calls named, in order.
func (f *FakeAgent) PushedTo() []agentclient.Target {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.pushedTo)
}

// Purposes returns the purposes the node's Replicate calls gave, in order.
func (f *FakeAgent) Purposes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.purposes)
}

// beforePush runs the test's BeforePush, if any, for a push of volume id
// to the node at peer. While the hook holds it, the push is the volume's
// transfer: Status lists it with the progress the hook reports, and
// another push of the volume is refused (Aborted), as a node refuses it.
func (f *FakeAgent) beforePush(ctx context.Context, id, peer, purpose string, each func(agentclient.Progress)) error {
	f.mu.Lock()
	hook := f.BeforePush
	running := f.pushing[id]
	t := &agentclient.Transfer{VolumeID: id, Peer: peer, Kind: "full", StartedUnix: time.Now().Unix(), Purpose: purpose}
	if hook != nil && running == nil {
		f.pushing[id] = t
	}
	f.mu.Unlock()
	if hook == nil {
		return nil
	}
	if running != nil {
		return errdefs.Wrap(errdefs.ErrAborted, "node %s: a push of %s to %s while its push to %s runs: retry", f.info.NodeID, id, peer, running.Peer)
	}
	defer func() {
		f.mu.Lock()
		delete(f.pushing, id)
		f.mu.Unlock()
	}()
	return hook(ctx, id, func(p agentclient.Progress) {
		f.mu.Lock()
		t.Bytes, t.TotalBytes = p.Bytes, p.TotalBytes
		f.mu.Unlock()
		if each != nil {
			each(p)
		}
	})
}

// push sends the primary of volume id to targetAddr and unlocks f.mu,
// which the caller holds: the target is locked only after it, so two
// pushes in opposite directions never wait for each other.
func (f *FakeAgent) push(id, targetAddr string) (agentclient.Progress, error) {
	c, err := f.primary(id)
	world := f.world
	f.mu.Unlock()
	if err != nil {
		return agentclient.Progress{}, err
	}
	at := f.tick()
	if c.MovingTo != "" && c.FencedUnixNano != 0 {
		// A fenced copy gains one snapshot after its fence, named with
		// the fence's time, and every later push of it sends that one.
		at = c.FencedUnixNano
	}
	p := agentclient.Progress{Kind: "full", Snapshot: id + "@" + contract.ReplicationSnapshotName(at), Done: true}
	if world == nil {
		return p, nil
	}
	if target := world.agent(targetAddr); target != nil {
		return p, target.receive(c, p.Snapshot, at)
	}
	return p, nil
}

// receive makes the node's copy of c's volume a replica of c that holds
// snapshot, taken at (unix nanos), unless the node holds a primary.
func (f *FakeAgent) receive(c agentclient.Copy, snapshot string, at int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.copies[c.VolumeID]
	if old.Exists && old.Role == contract.RolePrimary {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s holds the primary of volume %s: it receives no replica", f.info.NodeID, c.VolumeID)
	}
	r := agentclient.Copy{VolumeID: c.VolumeID, NodeID: f.info.NodeID, Exists: true, Role: contract.RoleReplica, Generation: c.Generation,
		Name: c.Name, Parameters: c.Parameters, CapacityBytes: c.CapacityBytes, LastSnapshot: snapshot, LastSnapshotUnixNano: at,
		PromisedGeneration: old.PromisedGeneration, PromisedHolder: old.PromisedHolder}
	f.setCopy(r)
	return nil
}

// MoveFinal fences the node's primary for targetNodeID (once: a second
// call keeps the first fence's time; refused as the node refuses it:
// fenceable) and pushes it as Replicate does.
func (f *FakeAgent) MoveFinal(ctx context.Context, id, targetAddr, targetNodeID string) (agentclient.Progress, error) {
	if err := f.beforePush(ctx, id, targetAddr, "the final step of the move to "+targetNodeID, nil); err != nil {
		return agentclient.Progress{}, err
	}
	f.mu.Lock()
	if err := f.enter("MoveFinal", id); err != nil {
		f.mu.Unlock()
		return agentclient.Progress{}, err
	}
	c, err := f.fenceTarget(id)
	if err != nil {
		f.mu.Unlock()
		return agentclient.Progress{}, err
	}
	if c.MovingTo != targetNodeID {
		if err := f.fenceable(c, targetNodeID); err != nil {
			f.mu.Unlock()
			return agentclient.Progress{}, err
		}
		c.MovingTo, c.FencedUnixNano = targetNodeID, f.tick()
		f.setCopy(c)
	}
	p, err := f.push(id, targetAddr)
	p.FencedAt = c.FencedUnixNano
	return p, err
}

// fenceTarget returns the node's primary of volume id for a fence or an
// unfence; as the node, it answers NotFound without a copy and
// FailedPrecondition for a replica. The caller holds f.mu.
func (f *FakeAgent) fenceTarget(id string) (agentclient.Copy, error) {
	c := f.copies[id]
	switch {
	case !c.Exists:
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrNotFound, "node %s holds no copy of volume %s", f.info.NodeID, id)
	case c.Role != contract.RolePrimary:
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s holds a %s of volume %s, not its primary", f.info.NodeID, c.Role, id)
	}
	return c, nil
}

// fenceable refuses to fence c for a move to target as the node does:
// while it is mounted, and unless the node promised target a generation
// above c's (volume.Manager.FenceHeld).
func (f *FakeAgent) fenceable(c agentclient.Copy, target string) error {
	if c.Mounted {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is still mounted on node %s; it can move to node %s once the CO has unpublished it there", c.VolumeID, f.info.NodeID, target)
	}
	if c.PromisedGeneration <= c.Generation || c.PromisedHolder != target {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s has not promised node %s a generation of volume %s above this copy's %d", f.info.NodeID, target, c.VolumeID, c.Generation)
	}
	return nil
}

// Unfence lifts the node's fences of its primary, as the node does: not
// while the node's own record promises a newer generation to another
// node; a move's fence first, when both are up; a lost lease's fence only
// for the copy's own generation.
func (f *FakeAgent) Unfence(_ context.Context, id string, generation uint64) (agentclient.Copy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Unfence", id); err != nil {
		return agentclient.Copy{}, err
	}
	c, err := f.fenceTarget(id)
	if err != nil {
		return agentclient.Copy{}, err
	}
	if (c.MovingTo != "" || c.LeaseFenced) && c.PromisedGeneration > c.Generation && c.PromisedHolder != f.info.NodeID {
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s promised generation %d of volume %s to node %s, above this copy's generation %d",
			f.info.NodeID, c.PromisedGeneration, id, c.PromisedHolder, c.Generation)
	}
	switch {
	case c.MovingTo != "":
		c.MovingTo, c.FencedUnixNano = "", 0
	case c.LeaseFenced && c.Generation != generation:
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is at generation %d; the confirmation was for generation %d", id, c.Generation, generation)
	case c.LeaseFenced:
		c.LeaseFenced = false
	default:
		return c, nil
	}
	f.setCopy(c)
	return c, nil
}

// Promote makes the node's replica the primary of the generation the
// node promised to itself, as the node does: only a replica below that
// generation, holding the snapshot of the move's fence (named after
// NotBeforeUnixNano) when it is a move's; a
// primary of that generation is promoted already (no promise checked). A
// failover records the replica's newest snapshot as the recovery point.
func (f *FakeAgent) Promote(_ context.Context, p agentclient.Promotion) (agentclient.Copy, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Promote", p.VolumeID); err != nil {
		return agentclient.Copy{}, err
	}
	c := f.copies[p.VolumeID]
	promoted := c.Exists && c.Role == contract.RolePrimary && c.Generation == p.Generation
	switch {
	case !promoted && (c.PromisedGeneration != p.Generation || c.PromisedHolder != f.info.NodeID):
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s was not promised generation %d of volume %s", f.info.NodeID, p.Generation, p.VolumeID)
	case !c.Exists:
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrNotFound, "node %s holds no copy of volume %s to promote", f.info.NodeID, p.VolumeID)
	case promoted:
	case c.Role != contract.RoleReplica:
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s holds volume %s as %s generation %d, not as a replica", f.info.NodeID, p.VolumeID, c.Role, c.Generation)
	case p.Generation <= c.Generation:
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s: promoting volume %s to generation %d, but its replica is already at %d", f.info.NodeID, p.VolumeID, p.Generation, c.Generation)
	case p.NotBeforeUnixNano > 0 && c.LastSnapshotUnixNano != p.NotBeforeUnixNano:
		// The node looks for the fence's own snapshot by its name; the
		// fake's replica keeps its newest only, which a fenced source's
		// pushes never pass.
		return agentclient.Copy{}, errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s's replica of volume %s lacks the snapshot %s the move fenced its source at", f.info.NodeID, p.VolumeID, contract.ReplicationSnapshotName(p.NotBeforeUnixNano))
	default:
		c.Role, c.Generation, c.MovingTo = contract.RolePrimary, p.Generation, ""
		if p.Failover {
			c.FailoverFromSnapshot = c.LastSnapshot
		}
		delete(f.demoted, p.VolumeID)
	}
	if p.Forced {
		c.ForcedGeneration = p.Generation
	}
	f.setCopy(c)
	return c, nil
}

// Fakes are fake node agents, each at the address "<node ID>:7670".
type Fakes struct {
	mu     sync.Mutex
	agents map[string]*FakeAgent
	peers  []string
	clock  int64 // the last unix nanos handed out to a snapshot or fence
}

// tick returns the fakes' clock: the wall clock, but never the same
// reading twice, so that snapshots and fences keep their order.
func (fs *Fakes) tick() int64 {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.clock = max(time.Now().UnixNano(), fs.clock+1)
	return fs.clock
}

// tick reads the clock of the node's Fakes, or the wall clock for a fake
// made alone.
func (f *FakeAgent) tick() int64 {
	if f.world == nil {
		return time.Now().UnixNano()
	}
	return f.world.tick()
}

// agent returns the fake at addr, or nil.
func (fs *Fakes) agent(addr string) *FakeAgent {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.agents[addr]
}

// Add returns the fake agent of a new node; a node without free space
// set gets 100 GiB.
func (fs *Fakes) Add(info agentclient.NodeInfo) *FakeAgent {
	if info.AvailableBytes == 0 {
		info.AvailableBytes = 100 << 30
	}
	if info.MaxQuotaBytes == 0 {
		info.MaxQuotaBytes = 8 << 30
	}
	f := NewFakeAgent(info)
	f.world = fs
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.agents == nil {
		fs.agents = map[string]*FakeAgent{}
	}
	addr := info.NodeID + ":7670"
	fs.agents[addr] = f
	fs.peers = append(fs.peers, addr)
	return f
}

// Alias lists the node nodeID at a second address too, as a peers file
// that names a node by its name and by its IP: the same agent answers at
// both.
func (fs *Fakes) Alias(nodeID, addr string) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.agents[addr] = fs.agents[nodeID+":7670"]
	fs.peers = append(fs.peers, addr)
}

// Cluster returns a cluster of the fake agents, plus peers at the extra
// addresses, which nobody answers. Each agent call is bounded by 2 s.
func (fs *Fakes) Cluster(t testing.TB, extra ...string) *cluster.Cluster {
	fs.mu.Lock()
	addrs := append(append([]string(nil), fs.peers...), extra...)
	fs.mu.Unlock()
	connect := func(addr string) (cluster.NodeAgent, error) {
		fs.mu.Lock()
		defer fs.mu.Unlock()
		f, ok := fs.agents[addr]
		if !ok {
			return nil, fmt.Errorf("%w: connection refused: %s", errdefs.ErrUnavailable, addr)
		}
		return f, nil
	}
	c := cluster.NewWithAgents(peers.Static(addrs), connect, 2*time.Second, hclog.NewNullLogger())
	t.Cleanup(c.Close)
	return c
}

// AcquireWorkLease grants the node's part of the work lease as a node
// does, from the node's start (a fake node has granted nothing before).
func (f *FakeAgent) AcquireWorkLease(_ context.Context, self worklease.Instance, release bool) (worklease.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("AcquireWorkLease", ""); err != nil {
		return worklease.Lease{}, err
	}
	return f.workLease.Acquire(self, release)
}

// WorkLeases tells who holds the node's part of the work lease.
func (f *FakeAgent) WorkLeases(context.Context) (worklease.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("WorkLeases", ""); err != nil {
		return worklease.Lease{}, err
	}
	return f.workLease.Look(), nil
}
