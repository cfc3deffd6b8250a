package provision

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// FindSnapshot finds a copy of the snapshot on any node. NotFound only
// when every node answered that it holds none.
func (p *Provisioner) FindSnapshot(ctx context.Context, id string) (cluster.Located[agentclient.Snapshot], error) {
	copies, err := p.SnapshotCopies(ctx, id)
	if err != nil {
		return cluster.Located[agentclient.Snapshot]{}, err
	}
	return copies[0], nil
}

// SnapshotCopies finds every copy of the snapshot: replication takes a
// CSI snapshot to each replica of its volume (docs/replication.md, "CSI
// snapshots"). They are sorted by node ID; a copy a record of the
// snapshot's deletion covers is none. An error when a node could not
// answer (it may hold one) and none did; NotFound only when every node
// answered that it holds none.
func (p *Provisioner) SnapshotCopies(ctx context.Context, id string) ([]cluster.Located[agentclient.Snapshot], error) {
	st, err := p.snapshotState(ctx, id)
	switch {
	case err != nil:
		return nil, err
	case len(st.live) == 0 && !st.allAnswered():
		return nil, fmt.Errorf("%w: cannot tell where snapshot %s is: %v", errdefs.ErrUnavailable, id, st.whyUnheard())
	case len(st.live) == 0:
		return nil, errdefs.Wrap(errdefs.ErrNotFound, "snapshot %s", id)
	}
	return st.live, nil
}

// snapshotState is what the nodes say of one snapshot: its copies, split
// by whether a record of its deletion covers them, and those records
// (docs/replication.md, "Deleted snapshots").
type snapshotState struct {
	live     []cluster.Located[agentclient.Snapshot] // copies no record covers, by node ID
	deleted  []cluster.Located[agentclient.Snapshot] // copies a record covers: the delete could not reach them
	records  []cluster.Located[agentclient.Snapshot] // the nodes' records of its deletion
	answered []cluster.Node                          // the nodes that answered
	silent   []error                                 // of the nodes that did not
}

// deletedUpTo is the newest creation time the records cover (0: none).
func (st snapshotState) deletedUpTo() int64 {
	var upTo int64
	for _, r := range st.records {
		upTo = max(upTo, r.Object.CreatedUnix)
	}
	return upTo
}

// allAnswered reports whether every node answered, those the
// controller's peer list no longer names included (cluster.AllAnswered).
func (st snapshotState) allAnswered() bool { return cluster.AllAnswered(st.answered, len(st.silent)) }

// whyUnheard names, for an error, the nodes that did not answer.
func (st snapshotState) whyUnheard() error {
	why := slices.Clone(st.silent)
	if unlisted := cluster.Unlisted(st.answered, len(st.silent)); unlisted != "" {
		why = append(why, errors.New(unlisted))
	}
	return errors.Join(why...)
}

// majority tells whether a majority of the nodes answered, counted over
// the largest membership a node reports (cluster.Majority): a record of
// the deletion written to one majority is then seen by the next.
func (st snapshotState) majority() bool {
	return cluster.Majority(st.answered, len(st.silent))
}

// snapshotState asks every node for its copy of snapshot id and its
// record of the snapshot's deletion.
func (p *Provisioner) snapshotState(ctx context.Context, id string) (snapshotState, error) {
	if !contract.IsSnapshotID(id) {
		return snapshotState{}, errdefs.Wrap(errdefs.ErrNotFound, "snapshot %q does not exist (not a snapshot ID of this driver)", id)
	}
	answers, unreachable, err := cluster.Ask(ctx, p.cluster, func(ctx context.Context, a cluster.Agent) ([]agentclient.Snapshot, error) {
		return a.ListSnapshots(ctx, agentclient.SnapshotQuery{SnapshotID: id, WithDeleted: true})
	})
	if err != nil {
		return snapshotState{}, err
	}
	var st snapshotState
	var copies []cluster.Located[agentclient.Snapshot]
	for _, a := range answers {
		if a.Err != nil && !errors.Is(a.Err, errdefs.ErrNotFound) {
			st.silent = append(st.silent, fmt.Errorf("node %s: %w", a.Node.Info.NodeID, a.Err))
			continue
		}
		st.answered = append(st.answered, a.Node)
		for _, s := range a.Object {
			switch {
			case s.SnapshotID != id:
			case s.Deleted:
				st.records = append(st.records, cluster.Located[agentclient.Snapshot]{Node: a.Node, Object: s})
			default:
				copies = append(copies, cluster.Located[agentclient.Snapshot]{Node: a.Node, Object: s})
			}
		}
	}
	for _, u := range unreachable {
		st.silent = append(st.silent, fmt.Errorf("agent %s unreachable: %w", u.Addr, u.Err))
	}
	upTo := st.deletedUpTo()
	for _, c := range copies {
		if c.Object.CreatedUnix <= upTo {
			st.deleted = append(st.deleted, c)
		} else {
			st.live = append(st.live, c)
		}
	}
	return st, nil
}

// CreateSnapshot snapshots the volume's current primary, or answers the
// snapshot of that name an earlier attempt made. Snapshot names are
// unique across the cluster, not per volume: the name taken by another
// volume's snapshot is AlreadyExists.
func (p *Provisioner) CreateSnapshot(ctx context.Context, name, sourceVolumeID string) (agentclient.Snapshot, error) {
	id := contract.SnapshotIDForName(name)
	st, err := p.snapshotState(ctx, id)
	if err != nil {
		return agentclient.Snapshot{}, err
	}
	// An earlier snapshot of this name deleted while a node was away: its
	// copies go first, or the volume's node would answer one of them as
	// the new snapshot; the new one is taken in a later second than the
	// records cover.
	if len(st.deleted) > 0 {
		if err := p.finishDeletion(ctx, id, st); err != nil {
			return agentclient.Snapshot{}, fmt.Errorf("%w: %v; retry", errdefs.ErrUnavailable, err)
		}
	}
	switch {
	case len(st.live) > 0 && st.live[0].Object.SourceVolumeID != sourceVolumeID:
		return agentclient.Snapshot{}, errdefs.Wrap(errdefs.ErrAlreadyExists, "snapshot %q exists for volume %s, not %s", name, st.live[0].Object.SourceVolumeID, sourceVolumeID)
	case len(st.live) > 0:
		return st.live[0].Object, nil
	case !st.allAnswered():
		return agentclient.Snapshot{}, fmt.Errorf("%w: cannot tell whether snapshot %q exists: %v", errdefs.ErrUnavailable, name, st.whyUnheard())
	}
	found, err := p.CurrentVolume(ctx, sourceVolumeID)
	if err != nil {
		return agentclient.Snapshot{}, err
	}
	cctx, cancel := p.cluster.Call(ctx)
	defer cancel()
	snap, err := found.Node.Agent.CreateSnapshot(cctx, sourceVolumeID, name, st.deletedUpTo())
	if err != nil {
		return agentclient.Snapshot{}, err
	}
	p.log.Info("snapshot created", "volume_id", sourceVolumeID, "snapshot_id", snap.SnapshotID, "node_id", found.Node.Info.NodeID)
	return snap, nil
}

// DeleteSnapshot deletes every copy of the snapshot; a snapshot no node
// holds is deleted already. Every node that answers remembers the
// deletion before its copy goes, and a majority of the nodes must: a
// copy the delete cannot reach (its node is away, or a push that started
// before the delete lands it later) is then never listed or restored
// while a majority answers, and is deleted by the next pass
// (FinishDeletions), which forgets the records once no copy is left.
func (p *Provisioner) DeleteSnapshot(ctx context.Context, id string) error {
	st, err := p.snapshotState(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(st.live) == 0 && len(st.deleted) == 0 {
		if st.allAnswered() || len(st.records) > 0 {
			return nil // no copy anywhere, or deleted already while the silent node was away
		}
		return fmt.Errorf("%w: cannot tell where snapshot %s is, and so whether it exists: %v; retry once the nodes answer",
			errdefs.ErrUnavailable, id, st.whyUnheard())
	}
	if !st.majority() {
		return fmt.Errorf("%w: snapshot %s cannot be deleted while most nodes do not answer (%v): a node that is away may hold a copy, and a majority must remember the deletion; retry once they answer",
			errdefs.ErrUnavailable, id, st.whyUnheard())
	}
	return p.rememberDeletion(ctx, id, st)
}

// rememberDeletion has every node that answered record the deletion of
// snapshot id and delete its copy.
func (p *Provisioner) rememberDeletion(ctx context.Context, id string, st snapshotState) error {
	var seen agentclient.Snapshot // the newest of the copies (all copies of one snapshot are alike)
	for _, c := range slices.Concat(st.live, st.deleted) {
		if c.Object.CreatedUnix > seen.CreatedUnix {
			seen = c.Object
		}
	}
	d := agentclient.SnapshotDeletion{SnapshotID: id, CreatedUpToUnix: seen.CreatedUnix, Remember: true, SourceVolumeID: seen.SourceVolumeID}
	// Every answering node must remember it: they are the majority the
	// caller counted.
	if err := failures(p.deleteSnapshotOn(ctx, st.answered, d)); err != nil {
		return fmt.Errorf("%w: snapshot %s is not deleted: remembering its deletion or deleting a copy failed on some nodes (%v); retry the delete",
			errdefs.ErrUnavailable, id, errors.Join(err, errors.Join(st.silent...)))
	}
	p.log.Info("snapshot deleted", "snapshot_id", id, "volume_id", seen.SourceVolumeID, "copies", len(st.live)+len(st.deleted), "remembered_on", len(st.answered))
	if !st.allAnswered() {
		p.log.Warn("snapshot deleted while a node that may hold a copy is away: the nodes that answered remember it; the away node's copy is hidden, and deleted when the node is back",
			"snapshot_id", id, "volume_id", seen.SourceVolumeID, "remembered_on", len(st.answered), "away", st.whyUnheard())
	}
	return nil
}

// finishDeletion deletes the copies a record covers, on the nodes that
// answered, and, when every node answered, forgets the records: then no
// copy they cover is left anywhere.
func (p *Provisioner) finishDeletion(ctx context.Context, id string, st snapshotState) error {
	answers := p.deleteSnapshotOn(ctx, nodesOf(st.deleted), agentclient.SnapshotDeletion{SnapshotID: id, CreatedUpToUnix: st.deletedUpTo()})
	if err := p.deleted(id, answers, sourceOf(st.deleted)); err != nil {
		return fmt.Errorf("snapshot %s was deleted while a node was away, and its copy there is not deleted yet: %w", id, err)
	}
	return p.forgetDeletion(ctx, id, st)
}

// forgetDeletion has the nodes forget the records of snapshot id's
// deletion, once every node answered and none held a copy they cover.
// Not in the pass that deleted the last ones: a push that started before
// may still land a covered copy, which the next pass finds and deletes.
// Every node records the deletion before any forgets it: a node can then
// forget only once no receive into the volume runs there (it waits for
// the volume's copy lock) and it holds no covered copy; a receive that
// lands one drops it while the record lives (volume.Manager.ForgetDeleted
// and Received). A node that refuses keeps its record for the next pass.
func (p *Provisioner) forgetDeletion(ctx context.Context, id string, st snapshotState) error {
	if len(st.records) == 0 || !st.allAnswered() || len(st.deleted) > 0 {
		return nil
	}
	upTo := st.deletedUpTo()
	source := st.records[0].Object.SourceVolumeID
	remember := agentclient.SnapshotDeletion{SnapshotID: id, CreatedUpToUnix: upTo, Remember: true, SourceVolumeID: source}
	if err := failures(p.deleteSnapshotOn(ctx, withoutRecord(st), remember)); err != nil {
		return fmt.Errorf("recording the deletion of snapshot %s on every node before forgetting it failed; it is retried: %w", id, err)
	}
	forget := agentclient.SnapshotDeletion{SnapshotID: id, CreatedUpToUnix: upTo, Forget: true}
	if err := failures(p.deleteSnapshotOn(ctx, st.answered, forget)); err != nil {
		return fmt.Errorf("forgetting the deletion of snapshot %s failed on some nodes, which keep their records; it is retried: %w", id, err)
	}
	p.log.Info("no copy of the deleted snapshot is left: its records are forgotten", "snapshot_id", id, "volume_id", source)
	return nil
}

// withoutRecord is the answering nodes that hold no record of the
// snapshot's deletion.
func withoutRecord(st snapshotState) []cluster.Node {
	recorded := map[string]bool{}
	for _, r := range st.records {
		recorded[r.Node.Info.NodeID] = true
	}
	var out []cluster.Node
	for _, n := range st.answered {
		if !recorded[n.Info.NodeID] {
			out = append(out, n)
		}
	}
	return out
}

// deleteSnapshotOn asks each of nodes, in parallel, to delete its copy
// (and remember or forget the deletion) as d says.
func (p *Provisioner) deleteSnapshotOn(ctx context.Context, nodes []cluster.Node, d agentclient.SnapshotDeletion) []cluster.Answer[struct{}] {
	return cluster.Each(ctx, p.cluster, nodes, func(ctx context.Context, n cluster.Node) (struct{}, error) {
		return struct{}{}, n.Agent.DeleteSnapshot(ctx, d)
	})
}

// deleted logs the copies of snapshot id the answers deleted and joins
// the errors of those that failed.
func (p *Provisioner) deleted(id string, answers []cluster.Answer[struct{}], volumeID string) error {
	for _, a := range answers {
		if a.Err == nil {
			p.log.Info("snapshot deleted", "snapshot_id", id, "volume_id", volumeID, "node_id", a.Node.Info.NodeID)
		}
	}
	return failures(answers)
}

// failures joins the errors of the answers that failed, each naming its
// node.
func failures(answers []cluster.Answer[struct{}]) error {
	var errs []error
	for _, a := range answers {
		if a.Err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", a.Node.Info.NodeID, a.Err))
		}
	}
	return errors.Join(errs...)
}

// FinishDeletions deletes the copies of snapshots deleted while their
// node was away, now on a node that answers, and forgets the records of
// those no node holds a copy of any more. The controller runs it every
// minute: a node's records are answered from its memory.
func (p *Provisioner) FinishDeletions(ctx context.Context) error {
	answers, _, err := cluster.Ask(ctx, p.cluster, func(ctx context.Context, a cluster.Agent) ([]agentclient.Snapshot, error) {
		return a.ListSnapshots(ctx, agentclient.SnapshotQuery{DeletedOnly: true})
	})
	if err != nil {
		return err
	}
	ids := map[string]bool{}
	for _, a := range answers {
		for _, s := range a.Object {
			ids[s.SnapshotID] = true
		}
	}
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		st, err := p.snapshotState(ctx, id)
		if err == nil {
			err = p.finishDeletion(ctx, id, st)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func nodesOf[T any](located []cluster.Located[T]) []cluster.Node {
	nodes := make([]cluster.Node, 0, len(located))
	for _, l := range located {
		nodes = append(nodes, l.Node)
	}
	return nodes
}

func sourceOf(copies []cluster.Located[agentclient.Snapshot]) string {
	if len(copies) == 0 {
		return ""
	}
	return copies[0].Object.SourceVolumeID
}

// SnapshotQuery selects snapshots: one by ID, those of a source volume,
// or all (empty fields select all), a page of them.
type SnapshotQuery struct {
	SnapshotID     string
	SourceVolumeID string
	// Backups lists the backup targets' backups too (backups_as_snapshots).
	Backups bool
	Page
}

// SnapshotPage is one page of the cluster's snapshots, sorted by ID;
// NextToken starts the next page (empty after the last).
type SnapshotPage struct {
	Snapshots []agentclient.Snapshot
	NextToken string
}

// ListSnapshots pages like ListVolumes: each node answers its first
// MaxEntries+1 snapshots from the token on, of the source volume when
// one is given (or the one snapshot asked for). With q.Backups the
// targets' backups are listed too, before the snapshots (their IDs sort
// first: "backup:" before "snap-"), each target answering all of its
// backups of the source volume, or of every volume.
func (p *Provisioner) ListSnapshots(ctx context.Context, q SnapshotQuery) (SnapshotPage, error) {
	isToken := contract.IsSnapshotID
	if q.Backups {
		isToken = func(id string) bool { return contract.IsSnapshotID(id) || contract.IsBackupID(id) }
	}
	if token := q.StartingToken; token != "" && !isToken(token) {
		return SnapshotPage{}, errBadToken(token)
	}
	var backups []agentclient.Snapshot
	if q.Backups {
		backups = p.backupSnapshots(ctx, q)
	}
	if contract.IsBackupID(q.SnapshotID) {
		return SnapshotPage{Snapshots: backups}, nil
	}
	nodeReq := agentclient.SnapshotQuery{SnapshotID: q.SnapshotID, SourceVolumeID: q.SourceVolumeID, WithDeleted: true}
	if contract.IsSnapshotID(q.StartingToken) {
		nodeReq.From = q.StartingToken // a backup's sorts before every snapshot
	}
	if q.MaxEntries > 0 {
		nodeReq.MaxEntries = uint32(q.MaxEntries) + 1
	}
	listed, err := fromEveryNode(ctx, p, "snapshots", func(ctx context.Context, n cluster.Node) ([]agentclient.Snapshot, error) {
		return n.Agent.ListSnapshots(ctx, nodeReq)
	})
	if err != nil {
		return SnapshotPage{}, err
	}
	// A snapshot is listed once, however many nodes hold a copy: the
	// copies are the same snapshot (same data, size and creation time).
	// A copy a record of the snapshot's deletion covers is hidden, after
	// the page is cut: each node's answer is complete up to the page's
	// end only when counted with its hidden copies.
	deletedUpTo := map[string]int64{}
	for _, l := range listed {
		if s := l.Object; s.Deleted {
			deletedUpTo[s.SnapshotID] = max(deletedUpTo[s.SnapshotID], s.CreatedUnix)
		}
	}
	hidden := func(s agentclient.Snapshot) bool { return s.CreatedUnix <= deletedUpTo[s.SnapshotID] }
	var all []agentclient.Snapshot
	at := map[string]int{}
	for _, l := range listed {
		s := l.Object
		if s.Deleted || (q.SnapshotID != "" && s.SnapshotID != q.SnapshotID) || (q.SourceVolumeID != "" && s.SourceVolumeID != q.SourceVolumeID) {
			continue
		}
		if i, ok := at[s.SnapshotID]; ok {
			if hidden(all[i]) && !hidden(s) {
				all[i] = s
			}
			continue
		}
		at[s.SnapshotID] = len(all)
		all = append(all, s)
	}
	all = append(all, backups...)
	sort.Slice(all, func(i, j int) bool { return all[i].SnapshotID < all[j].SnapshotID })
	page, next, err := paginate(all, func(s agentclient.Snapshot) string { return s.SnapshotID }, q.StartingToken, q.MaxEntries, isToken)
	if err != nil {
		return SnapshotPage{}, err
	}
	page = slices.DeleteFunc(page, hidden)
	return SnapshotPage{Snapshots: page, NextToken: next}, nil
}

// backupSnapshots lists the targets' backups as snapshots, of the
// query's source volume or snapshot ID: each its backup's snapshot ID,
// the volume it is of (deleted or not), its size and the time the target
// received it. A target that does not answer is left out of the list,
// as a node is.
func (p *Provisioner) backupSnapshots(ctx context.Context, q SnapshotQuery) []agentclient.Snapshot {
	if p.targets == nil {
		return nil
	}
	names, volumeID := p.targets.Names(), q.SourceVolumeID
	if q.SnapshotID != "" {
		ref, ok := contract.ParseBackupID(q.SnapshotID)
		if !ok || (volumeID != "" && volumeID != ref.VolumeID) || !slices.Contains(names, ref.Target) {
			return nil
		}
		names, volumeID = []string{ref.Target}, ref.VolumeID
	}
	var out []agentclient.Snapshot
	for _, name := range names {
		cctx, cancel := p.cluster.Call(ctx)
		backups, err := p.targets.Backups(cctx, name, volumeID)
		cancel()
		if err != nil {
			p.log.Warn("listing the backups of a backup target failed; the list of snapshots leaves them out", "target", name, "error", err)
			continue
		}
		for _, b := range backups {
			s := agentclient.Snapshot{SnapshotID: b.Ref().SnapshotID(), SourceVolumeID: b.VolumeID, SizeBytes: b.ReferencedBytes, CreatedUnix: b.Received.Unix()}
			if q.SnapshotID == "" || s.SnapshotID == q.SnapshotID {
				out = append(out, s)
			}
		}
	}
	return out
}
