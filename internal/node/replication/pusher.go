package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Progress reports a transfer as it runs.
type Progress struct {
	Kind     string
	Snapshot string
	Base     string
	Bytes    int64
	// Total is zfs send's estimate of the whole stream; 0 if unknown.
	Total int64
	Done  bool
	// FencedAt is the fence's time (unix nanos) of a push with a Fence.
	FencedAt int64
}

// Fence fences the volume's primary for a move, under the copy's lock the
// caller holds, at the time given (unix nanos), and returns the fence's
// time (an earlier one when it was fenced for the same move already).
type Fence func(ctx context.Context, at int64) (int64, error)

// Pusher sends this node's volumes to peers.
type Pusher struct {
	// Metrics, when set, records every transfer.
	Metrics *Metrics

	z      Pool
	root   string
	nodeID string
	keep   int
	limit  *Limiter
	peers  Peers
	log    hclog.Logger
	locks  *copylock.Locks // the node's, shared with volume.Manager
	now    func() time.Time
	// targets are the backup targets pushes may go to, by name, and
	// targetPeers reaches them (UseTargets).
	targets     map[string]string
	targetPeers TargetPeers

	mu        sync.Mutex
	transfers map[string]*Transfer // by volume ID
	// sent is, by volume ID and peer node ID, the snapshot a push sent
	// last: the peer's base before the tidy holds it (peerBases).
	sent map[string]map[string]string
	// streamed is, by volume ID and receiver key, the snapshots whose
	// streams to that receiver started since a push to it last succeeded
	// (mayHold).
	streamed map[string]map[string][]string
	// seeded are the volumes whose first push in this process recorded,
	// in unknown (by volume ID and receiver key), what an earlier process
	// may have streamed (seedUnknown).
	seeded  map[string]bool
	unknown map[string]map[string][]string
	// kept is, by volume ID, the base its running backup keeps, which
	// nothing else spares (keepBase).
	kept map[string]string
	// refused is, by dataset and peer node ID, the newest snapshot (GUID)
	// of a replica whose node refused to roll it back (rollbackRefused).
	refused map[string]uint64
	// backupFailures are, by volume ID and target, the last failed
	// backup of those not succeeded since (BackupFailures).
	backupFailures map[string]BackupFailure
}

// Peers reaches the receiving nodes: agent.ReplicationPeers over the
// agent port, keeping a connection per peer between pushes.
type Peers interface {
	// Peer returns the node at addr, held to node nodeID: every answer
	// must come from it. With nodeID "", the node whose certificate
	// answers first is the one, and its ReplicaState must name it.
	Peer(addr, nodeID string) (Peer, error)
	// Close closes the connections to the peers.
	Close()
}

// Close closes the connections to peers.
func (p *Pusher) Close() {
	if p.peers != nil {
		p.peers.Close()
	}
}

// NewPusher returns a Pusher for the node whose volumes live under root
// and whose copies locks guards (the node's, which the volume Manager
// takes too); peers reaches the receiving nodes; keep replication
// snapshots are kept besides the held bases.
func NewPusher(z Pool, locks *copylock.Locks, root, nodeID string, keep int, limit *Limiter, peers Peers, log hclog.Logger) *Pusher {
	return &Pusher{z: z, locks: locks, root: root, nodeID: nodeID, keep: keep, limit: limit, peers: peers, log: log, now: time.Now}
}

// UseClock sets the node's wall clock (time.Now by default), which names
// replication snapshots: the simulation skews it per node.
func (p *Pusher) UseClock(now func() time.Time) { p.now = now }

// Push brings the replica of volumeID on the peer at addr up to date:
// resuming an interrupted transfer, or sending a new snapshot
// incrementally from the newest common one (full when there is none).
// report is called as bytes flow (at most every interval) and at the end.
//
// The push is the volume's transfer (copylock): a delete or demote stops
// it. It changes the copy only under the copy's lock: its snapshot, and
// after the stream the unsent snapshot's removal or the tidy.
//
// Whoever answers at addr must be the node it says it is (its ReplicaState
// names the node its certificate names), and the same node throughout.
func (p *Pusher) Push(ctx context.Context, volumeID, addr string, interval time.Duration, report func(Progress)) (Progress, error) {
	return p.PushFenced(ctx, volumeID, addr, "", "", interval, report, nil)
}

// PushFenced is Push for a planned move's final push: fence puts the
// primary's fence up under the same lock hold as the push's snapshot, and
// the snapshot is named with the fence's time, so it holds everything
// the copy will ever have here (nothing can write an unmounted copy while
// its lock is held). The fence's write and the snapshot run at once and
// share the pool's sync: a separate Fence call cost a move a sync and a
// round trip. The answer carries the fence's time.
// purpose says why the push runs, in Transfers. nodeID, when not empty,
// is the node expected at addr (a move's target): a server whose
// certificate names another node is refused before anything is sent.
func (p *Pusher) PushFenced(ctx context.Context, volumeID, addr, nodeID, purpose string, interval time.Duration, report func(Progress), fence Fence) (Progress, error) {
	job := pushJob{volumeID: volumeID, addr: addr, nodeID: nodeID, purpose: purpose, interval: interval, report: report, fence: fence,
		log: p.log.With("volume_id", volumeID, "peer", addr)}
	return p.run(ctx, job, "a push to "+addr)
}

// run runs job as the volume's transfer (what, in the words of
// copylock), then drops the snapshot it took but did not send, or starts
// the tidy after a push that sent.
func (p *Pusher) run(ctx context.Context, job pushJob, what string) (Progress, error) {
	fs, err := dataset(p.root, job.volumeID)
	if err != nil {
		return Progress{}, err
	}
	job.fs = fs
	tctx, end, err := p.locks.StartTransfer(ctx, job.volumeID, what)
	if err != nil {
		return Progress{}, err
	}
	out, err := p.push(tctx, job)
	end()
	if out.unsent != "" {
		p.dropSnapshot(job.volumeID, fs, out.unsent, job.log)
	}
	if err != nil {
		return Progress{}, err
	}
	p.startTidy(job.volumeID, fs, out.base, out.peer, job.log)
	return out.prog, nil
}

// pushed is what a push did, for what follows it under the copy's lock.
type pushed struct {
	prog   Progress
	unsent string // a snapshot the push took but did not send
	base   string // the snapshot the peer now has
	peer   string // that peer's node ID
}

// pushJob is what one push is asked to do (PushFenced's arguments).
type pushJob struct {
	volumeID, fs, addr, nodeID, purpose string
	interval                            time.Duration
	report                              func(Progress)
	fence                               Fence
	log                                 hclog.Logger
	// backup: the push goes to the backup target nodeID (PushBackup).
	backup bool
}

// receiverKey is the key of the push's receiver, which answered as
// nodeID, among the volume's receivers here (base hold tags, what was
// sent to whom): its node ID, or for a backup target backupKey.
func (job pushJob) receiverKey(nodeID string) string {
	if job.backup {
		return backupKey(nodeID)
	}
	return nodeID
}

// push sends; see Push.
func (p *Pusher) push(ctx context.Context, job pushJob) (pushed, error) {
	// Every call of the push is answered by one node: nodeID, or the
	// node whose certificate answers first, which must be the node its
	// ReplicaState names.
	peers := p.peers
	if job.backup {
		peers = p.targetPeers
	}
	peer, err := peers.Peer(job.addr, job.nodeID)
	if err != nil {
		return pushed{}, errdefs.Wrap(errdefs.ErrUnavailable, "peer %s: %v", job.addr, err)
	}
	prep, err := p.prepare(ctx, peer, job)
	if err != nil {
		return pushed{unsent: prep.snap}, err
	}
	if prep.release != nil {
		defer prep.release()
	}
	out, streamed, err := p.send(ctx, peer, job, prep)
	p.noteRollback(job.fs, prep.state.NodeID, prep.plan, err)
	if !streamed {
		// Unless its stream started (then a receiver's resume token may
		// need it), the snapshot goes again: a peer that keeps refusing,
		// or a push that resumes instead, must not pile them up.
		out.unsent = prep.snap
	}
	return out, err
}

// preparedPush is a push ready to send: its header, what the peer holds,
// the plan, and the snapshot it took.
type preparedPush struct {
	header   Header
	state    ReplicaState
	plan     sendPlan
	snap     string // the push's own snapshot; "" when it was not taken
	fencedAt int64
	// release ends the sparing of the plan's base (keepBase), if any.
	release func()
	// known: a snapshot here carries a tag of the receiver's, so its
	// streams need no mark (streamed.go).
	known bool
}

// prepare takes the push's snapshot (and fence) and plans what to send.
// It returns what it took also when it fails.
func (p *Pusher) prepare(ctx context.Context, peer Peer, job pushJob) (preparedPush, error) {
	// The new replication snapshot is taken while the peer says what it
	// holds: each waits tens of milliseconds (a pool sync, a round trip).
	props, snap, snapped, err := p.snapshot(ctx, job)
	if err != nil {
		return preparedPush{}, err
	}
	header := p.header(job.volumeID, props)
	// Encrypted volumes are sent raw, so they stay encrypted on the peer.
	raw := props["encryption"] != "off" && props["encryption"] != "-"
	// This node's snapshots are listed meanwhile too: the listing is the
	// plan's longest read, and the plan needs of it only the snapshots
	// older than the one in flight (the bases the peer may share).
	local := p.listAhead(ctx, job.fs)
	// What was sent is read before the holds are listed: a tidy holds
	// its base before it forgets it was sent, so one of the two has it.
	sentTo := p.sentTo(job.volumeID)
	held := ahead(func() (map[string][]string, error) { return p.z.Holds(ctx, job.fs) })
	state, err := peer.ReplicaState(ctx, job.volumeID)
	taken := <-snapped
	prep := preparedPush{header: header, state: state, fencedAt: taken.fencedAt}
	if taken.err == nil && taken.own {
		prep.snap = snap
	}
	if taken.fenceErr != nil {
		return prep, fmt.Errorf("fencing the primary of volume %s: %w", job.volumeID, taken.fenceErr)
	}
	if err != nil {
		return prep, err
	}
	p.learnReceiver(job.volumeID, job.receiverKey(state.NodeID), local, held, state.SnapshotGUIDs)
	if job.backup {
		// A backup target whose base is gone takes a full stream into a
		// new chain (planBackup): what it may hold needs no mark.
		prep.known = true
		if prep.plan, err = p.planBackup(ctx, job.fs, state, raw, snap, taken.err, local, job.log); err != nil {
			return prep, err
		}
		prep.plan, prep.release, err = p.keepBackupBase(ctx, job, prep.plan, held, job.receiverKey(state.NodeID))
		return prep, err
	}
	plan, err := p.plan(ctx, job.fs, state, header, raw, snap, taken.err, local, job.log)
	if err != nil || plan.current {
		prep.plan = plan
		return prep, err
	}
	prep.known = receiverKnown(held, job.receiverKey(state.NodeID))
	prep.plan, err = p.bridge(plan, state, &prep.header, local, held, sentTo)
	return prep, err
}

// send sends a prepared push's streams, tracked as the volume's transfer
// and reported every interval; streamed says whether the stream of the
// push's own snapshot started.
func (p *Pusher) send(ctx context.Context, peer Peer, job pushJob, prep preparedPush) (out pushed, streamed bool, err error) {
	plan, target := prep.plan, job.receiverKey(prep.state.NodeID)
	prog := plan.prog
	prog.FencedAt = prep.fencedAt
	if plan.current {
		job.log.Info("the peer holds the fenced copy's snapshot already; nothing to send", "snapshot", prog.Snapshot)
		p.noteSent(job.volumeID, target, prog.Snapshot)
		prog.Done = true
		job.report(prog)
		return pushed{prog: prog, base: prog.Snapshot, peer: target}, false, nil
	}
	var total atomic.Int64
	defer p.estimateLater(ctx, plan, &total, job.log)()
	log := job.log.With("kind", prog.Kind, "snapshot", prog.Snapshot, "base", prog.Base)
	log.Info("sending", "bridges", len(plan.bridges))
	transfer := &Transfer{VolumeID: job.volumeID, Peer: job.addr, Purpose: job.purpose, Started: p.now(), Progress: prog}
	defer p.track(job.volumeID, transfer)()

	var sent atomic.Int64
	stop := p.reportEvery(job.interval, func() {
		prog.Bytes, prog.Total = sent.Load(), total.Load()
		p.update(transfer, prog)
		job.report(prog)
	})
	defer stop()
	// The peer bases the target lacks go first, each a stream of its own
	// (bridge); a failure leaves the target with those that arrived, and
	// the next push goes on from the newest.
	known := prep.known
	for _, b := range plan.bridges {
		p.noteStreaming(job.volumeID, target, b.spec.Snapshot)
		if known, err = p.markStream(ctx, known, job.volumeID, target, b.spec.Snapshot); err != nil {
			return pushed{}, false, err
		}
		if _, err := p.sendStream(ctx, peer, prep.header, b, &sent, job.volumeID, target, job.addr, log); err != nil {
			return pushed{}, false, err
		}
	}
	p.noteStreaming(job.volumeID, target, plan.spec.Snapshot)
	if _, err = p.markStream(ctx, known, job.volumeID, target, plan.spec.Snapshot); err != nil {
		return pushed{}, false, err
	}
	streamed = plan.spec.Snapshot == prep.snap
	guid, err := p.sendStream(ctx, peer, prep.header, streamSpec{kind: kindOf(plan.spec), spec: plan.spec}, &sent, job.volumeID, target, job.addr, log)
	if err != nil {
		// A receiver's refusal is its verdict before anything of the
		// stream was received: the snapshot goes again, as one whose
		// stream never started. Kept, it would be one more snapshot
		// after what the receiver holds (a fenced source's push to a
		// target promoted meanwhile, which the demoted source would then
		// hold and the new primary lack).
		return pushed{}, streamed && !refusedWhole(err), err
	}
	stop()
	// The peer now has the snapshot: it becomes this peer's base here too.
	// Holding it need not delay the caller (a move waits for this push):
	// the old base stays held until it is.
	base, err := p.sentSnapshot(ctx, job.fs, plan, guid)
	if err != nil {
		return pushed{}, streamed, err
	}
	p.noteSent(job.volumeID, target, base)
	p.forgetStreamed(job.volumeID, target)
	prog.Bytes, prog.Done = sent.Load(), true
	prog.Total = prog.Bytes // what the estimate was for
	job.report(prog)
	log.Info("sent", "bytes", prog.Bytes)
	return pushed{prog: prog, base: base, peer: target}, streamed, nil
}

// estimateLater estimates the size of what plan sends (zfs send -nP, a
// process of its own) into total, for progress reports only, after
// estimateDelay: a short push (a move's final increment) ends without it
// instead of sharing the CPU with it, and a long one has it for all but
// its first moments. The function it returns cancels an estimate not yet
// started.
func (p *Pusher) estimateLater(ctx context.Context, plan sendPlan, total *atomic.Int64, log hclog.Logger) (cancel func()) {
	whole := plan.spec // the bridges and the last stream: from the plan's base
	if whole.ResumeToken == "" {
		whole.Base = plan.prog.Base
	}
	estimate := time.AfterFunc(estimateDelay, func() {
		if n, err := p.z.EstimateSize(ctx, whole); err == nil {
			total.Store(n)
		} else {
			log.Debug("no size estimate", "error", err)
		}
	})
	return func() { estimate.Stop() }
}

// A streamSpec is one stream of a push.
type streamSpec struct {
	kind string // KindFull, KindIncremental or KindResume
	spec zfs.SendSpec
	guid uint64 // of the snapshot sent; 0 when resuming
}

// sendStream sends one stream to the peer and returns the GUID of the
// snapshot the peer says it received; sent counts its bytes.
func (p *Pusher) sendStream(ctx context.Context, peer Peer, header Header, st streamSpec, sent *atomic.Int64,
	volumeID, peerNode, addr string, log hclog.Logger) (uint64, error) {
	h := header
	h.Kind, h.Snapshot = st.kind, copyrecord.ShortSnapshotName(st.spec.Snapshot)
	stream, err := peer.Receive(ctx, h)
	if err != nil {
		return 0, err
	}
	before, started := sent.Load(), p.now()
	streamBroke := false // the stream failed, not zfs send
	w := newChunkWriter(func(b []byte) error {
		if err := p.limit.Wait(ctx, len(b)); err != nil {
			return err
		}
		err := stream.Send(b)
		streamBroke = err != nil
		return err
	}, sent)
	_, sendErr := p.z.Send(ctx, st.spec, w)
	if sendErr == nil {
		sendErr = w.flush()
	}
	w.stop() // streamBroke is read below, and the stream closed
	bytes := sent.Load() - before
	if sendErr != nil {
		_, recvErr := stream.CloseAndRecv() // the receiver's own account, if it has one
		log.Warn("send failed; the next push resumes", "stream", st.spec.Snapshot, "bytes", bytes, "error", sendErr, "receiver", recvErr)
		p.Metrics.transfer("out", st.kind, peerNode, bytes, p.now().Sub(started), sendErr)
		if streamBroke && receiverSaidWhy(recvErr) {
			// The receiver refused or gave up and said why: its verdict,
			// not the broken stream it caused, is the answer (a move
			// retries Aborted). When zfs send failed here, the receiver
			// only saw the stream end short: the send's error is the
			// answer.
			return 0, fmt.Errorf("sending volume %s to %s: %w", volumeID, addr, recvErr)
		}
		return 0, errdefs.Wrap(errdefs.ErrUnavailable, "sending volume %s to %s: %v (receiver: %v)", volumeID, addr, sendErr, recvErr)
	}
	result, err := stream.CloseAndRecv()
	p.Metrics.transfer("out", st.kind, peerNode, bytes, p.now().Sub(started), err)
	if err != nil {
		return 0, err
	}
	if st.guid != 0 && result.SnapshotGUID != st.guid {
		return 0, fmt.Errorf("the peer received snapshot guid %d, but %s (guid %d) was sent", result.SnapshotGUID, st.spec.Snapshot, st.guid)
	}
	return result.SnapshotGUID, nil
}

// refusedWhole reports whether err is a receiver's refusal of a whole
// stream, made before it received any of it (admission: the header, the
// replica's state, the first record).
func refusedWhole(err error) bool {
	switch errdefs.Code(err) {
	case codes.FailedPrecondition, codes.InvalidArgument, codes.PermissionDenied, codes.AlreadyExists:
		return true
	}
	return false
}

// receiverSaidWhy reports whether a receiver's answer to a broken stream
// is a verdict of its own (a refusal, or Aborted: busy or failed to
// receive) rather than the transport's failure.
func receiverSaidWhy(recvErr error) bool {
	for _, kind := range []error{errdefs.ErrAborted, errdefs.ErrFailedPrecondition, errdefs.ErrInvalidArgument, errdefs.ErrNotFound,
		errdefs.ErrAlreadyExists, errdefs.ErrOutOfRange, errdefs.ErrPermissionDenied, errdefs.ErrResourceExhausted} {
		if errors.Is(recvErr, kind) {
			return true
		}
	}
	return false
}

// taken is what snapshot did under the copy's lock.
type taken struct {
	own      bool  // the snapshot was taken, not a fenced copy's found
	err      error // the snapshot's
	fencedAt int64
	fenceErr error
}

// snapshot reads the volume's labels and takes the push's replication
// snapshot, under the copy's lock: only a primary is sent, and no delete
// or demote can overtake the snapshot. With a fence, the fence goes up
// under the same hold, beside the snapshot. The lock is released when
// both are done, which snapped reports, so the caller can ask the peer
// meanwhile.
func (p *Pusher) snapshot(ctx context.Context, job pushJob) (props map[string]string, snap string, snapped <-chan taken, err error) {
	volumeID, fs, fence := job.volumeID, job.fs, job.fence
	unlock, err := p.locks.Lock(ctx, volumeID, "a push's snapshot")
	if err != nil {
		return nil, "", nil, err
	}
	props, err = p.z.Properties(ctx, fs, copyrecord.PropRole, copyrecord.PropName, copyrecord.PropGeneration, copyrecord.PropHistoryFrom, copyrecord.PropParameters,
		copyrecord.PropMovingTo, copyrecord.PropFencedAt, "refquota", "quota", "encryption")
	to := copyrecord.MovingTo(props[copyrecord.PropMovingTo])
	if errors.Is(err, zfs.ErrNotFound) {
		err = errdefs.Wrap(errdefs.ErrNotFound, "volume %s is not on this node: %v", volumeID, err)
	} else if err != nil {
		err = fmt.Errorf("reading the labels of %s: %w", fs, err)
	} else if role := props[copyrecord.PropRole]; role != contract.RolePrimary {
		err = errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is a %s here; only a primary is sent", volumeID, role)
	} else if job.fence == nil && to != "" && (job.backup || job.nodeID != to) {
		// A fenced primary sends only to its move's target (the move's
		// catch-up and final pushes): its fence's snapshot is one the
		// target gets before the move demotes this copy to a replica of
		// the target's generation. One sent elsewhere would be a
		// snapshot that replica holds and its new primary lacks, which
		// no push could then change (mayhold.go). A fenced push names
		// its own target: its fence, beside its snapshot, labels the copy
		// as moving there (FenceHeld refuses unless this node's record
		// promises that node the next generation).
		err = errdefs.Wrap(errdefs.ErrFailedPrecondition, "volume %s is fenced here for its move to node %s: it is sent only to that node until the move ends (pushes then go from the new primary) or is called off", volumeID, to)
	}
	if err != nil {
		unlock()
		return nil, "", nil, err
	}
	at, snap, own, err := p.pushSnapshot(ctx, job, props)
	if err != nil {
		unlock()
		return nil, "", nil, err
	}
	// Which write the pool applies first does not matter: the copy is not
	// mounted (the fence refuses otherwise) and cannot be while the lock
	// is held, so the snapshot holds the same either way, and a snapshot
	// without its fence (a crash between) is only one more snapshot.
	done := make(chan taken, 1)
	go func() {
		defer unlock()
		t := taken{own: own}
		fenced := make(chan struct{})
		if fence != nil {
			go func() {
				defer close(fenced)
				t.fencedAt, t.fenceErr = fence(ctx, at)
			}()
		} else {
			close(fenced)
		}
		if own {
			t.err = p.z.Snapshot(ctx, snap, nil)
		}
		<-fenced
		done <- t
	}()
	return props, snap, done, nil
}

// pushSnapshot names the push's snapshot, and says whether the push
// takes it (own) or finds it. A fenced copy gains one snapshot after its
// fence: the fence's own, named with its time, which every later push of
// it to the move's target sends again (taken then if a crash came between
// the two). Nothing can write the copy since, so a newer snapshot would
// add nothing but one the target may lack (its push broke, or the target
// was promoted meanwhile), which the replica the move demotes this copy
// to would hold and its new primary not (docs/replication.md, "A replica
// is never ahead of its primary's snapshots"). A promotion checks that
// the target holds the snapshot of the fence's name. Otherwise the
// snapshot is new, named with the time now: a push that fences names it
// with the fence's time.
func (p *Pusher) pushSnapshot(ctx context.Context, job pushJob, props map[string]string) (at int64, snap string, own bool, err error) {
	to := copyrecord.MovingTo(props[copyrecord.PropMovingTo])
	fencedAt, fenced := copyrecord.FencedAt(props[copyrecord.PropFencedAt])
	if !fenced || to == "" || (job.fence != nil && job.nodeID != to) {
		at = p.now().UnixNano()
		return at, fmt.Sprintf("%s@%s", job.fs, contract.ReplicationSnapshotName(at)), true, nil
	}
	snap = fmt.Sprintf("%s@%s", job.fs, contract.ReplicationSnapshotName(fencedAt))
	switch _, err := p.guidOf(ctx, snap); {
	case err == nil:
		return fencedAt, snap, false, nil
	case errors.Is(err, zfs.ErrNotFound):
		return fencedAt, snap, true, nil
	default:
		return 0, "", false, fmt.Errorf("looking for the fence's snapshot %s: %w", snap, err)
	}
}

// dropSnapshot destroys, under the copy's lock, a replication snapshot of
// fs a push took but did not send, and the streamed tag it may carry
// (a receiver refused its stream whole). Failing that, pruning takes it
// later.
func (p *Pusher) dropSnapshot(volumeID, fs, snap string, log hclog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), tidyTimeout)
	defer cancel()
	unlock, err := p.locks.Lock(ctx, volumeID, "dropping an unsent snapshot")
	if err != nil {
		log.Warn("an unsent replication snapshot stays; pruning takes it later", "snapshot", snap, "error", err)
		return
	}
	defer unlock()
	if err := p.releaseStreamed(ctx, fs, snap); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		log.Warn("releasing an unsent replication snapshot's hold failed; pruning takes it once a push to its receiver succeeds", "snapshot", snap, "error", err)
		return
	}
	if err := p.z.DestroySnapshot(ctx, snap); err != nil && !errors.Is(err, zfs.ErrNotFound) {
		log.Warn("destroying an unsent replication snapshot failed; pruning takes it later", "snapshot", snap, "error", err)
	}
}

// estimateDelay is how long a push runs before it estimates its size.
const estimateDelay = time.Second

// tidyTimeout bounds the clean-up after a push.
const tidyTimeout = 2 * time.Minute

// startTidy tidies after a successful push, in the background: the caller
// (a move waits for the push) need not wait for its holds and prunes. It
// runs under the copy's lock, and only on a primary: a delete or demote
// that came first leaves it nothing to do.
func (p *Pusher) startTidy(volumeID, fs, base, peer string, log hclog.Logger) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), tidyTimeout)
		defer cancel()
		unlock, err := p.locks.Lock(ctx, volumeID, "tidy after a push")
		if err != nil {
			log.Debug("no tidy after this push; the next one tidies", "error", err)
			return
		}
		defer unlock()
		if role, err := p.z.Property(ctx, fs, copyrecord.PropRole); err != nil || role != contract.RolePrimary {
			return
		}
		p.tidy(ctx, volumeID, fs, base, peer, log)
	}()
}

// tidy runs after a successful push. It holds base, the snapshot the peer
// now has, with the peer's tag before anything releases the old base, so
// some common snapshot is always held; the peer's streamed tag goes then
// (its base tag makes it known to a restarted process, streamed.go). A
// primary receives nothing: the hold it kept as a replica (before a move
// or failover promoted it) would pin its old base forever. Then old
// replication snapshots are pruned, except the bases other peers
// received whose tidies have not held them yet (tidies after pushes to
// different peers may run in either order) and the snapshots a peer may
// hold beyond its base (mayHold).
// Stopped at any step, it leaves some common snapshot held.
func (p *Pusher) tidy(ctx context.Context, volumeID, fs, base, peer string, log hclog.Logger) {
	if err := p.z.Hold(ctx, base, peerTag(peer)); err != nil {
		log.Warn("holding the new base failed; the old base stays held until a push holds a newer one", "snapshot", base, "error", err)
		return
	}
	p.forgetSent(volumeID, peer, base)
	superseded := func(tag string) bool { return isReceiverTag(tag) || tag == streamedTag(peer) }
	if err := copyrecord.ReleaseHolds(ctx, p.z, fs, superseded); err != nil {
		log.Warn("releasing a former replica's hold, or the peer's streamed tag, failed; next push retries", "error", err)
	}
	spare := append(slices.Collect(maps.Values(p.sentTo(volumeID))), p.mayHold(volumeID)...)
	if kept := p.keptBase(volumeID); kept != "" {
		spare = append(spare, kept)
	}
	dropOldBases(ctx, p.z, fs, p.keep, spare, "push", log)
}

// header describes the volume to the receiver, from its properties: what
// a replica must carry to become the primary one day.
func (p *Pusher) header(volumeID string, props map[string]string) Header {
	h := Header{VolumeID: volumeID, SourceNodeID: p.nodeID, VolumeName: props[copyrecord.PropName]}
	h.Generation, _ = strconv.ParseUint(props[copyrecord.PropGeneration], 10, 64)
	h.HistoryFrom = copyrecord.HistoryFrom(props[copyrecord.PropHistoryFrom], h.Generation)
	h.Parameters = copyrecord.DecodeParameters(props[copyrecord.PropParameters])
	for _, q := range []string{"refquota", "quota"} { // whichever the operator uses
		if n, err := strconv.ParseUint(props[q], 10, 64); err == nil && n > 0 {
			h.CapacityBytes = n
			break
		}
	}
	return h
}
