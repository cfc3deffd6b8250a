package replication

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/volumelog"
)

// Receiver is the receiving end of replication on a node: it tells
// senders what it holds and receives their streams into replicas under
// its root.
type Receiver struct {
	// Metrics, when set, records every transfer.
	Metrics *Metrics

	// MaxQuota, when set, bounds every stream: a stream may carry at most
	// its volume's capacity, and never more than this (the operator's
	// max_quota), plus a margin for its own records (streamLimit). zfs
	// receive enforces no quota, so without a bound a peer could fill
	// the pool.
	MaxQuota uint64
	// QuotaProperty, when set, is set on every replica to the primary's
	// capacity (quota or refquota, as the node's volumes have).
	QuotaProperty string

	// IdleTimeout ends a receive whose sender sent nothing for that long
	// (default DefaultIdleTimeout): a peer that stalls must not hold a
	// zfs receive and the replica's lock forever. What arrived stays
	// resumable.
	IdleTimeout time.Duration
	// MinRate (bytes per second, default DefaultMinRate; 0: none) ends a
	// receive whose sender trickles: one that averages less runs out of
	// a credit of at most twice IdleTimeout (stallGuard).
	MinRate uint64
	// MaxReplicasPerPeer bounds the replicas one peer's full streams may
	// create here (0: no bound): a stream that would create one more is
	// refused with ResourceExhausted (peerBound).
	MaxReplicasPerPeer int

	// OpenZFS, when set, is the node's OpenZFS release, named when a
	// stream of a newer release is refused.
	OpenZFS string

	z      Pool
	root   string
	nodeID string
	keep   int
	log    hclog.Logger
	locks  *copylock.Locks // the node's, shared with volume.Manager
	// replicas reads and removes the copies under root; index learns of
	// every receive.
	replicas *copyrecord.Replicas
	index    Index
	slots    chan struct{} // one per receive allowed at once
	peers    peerBound
}

// DefaultIdleTimeout is how long a receive waits for the sender's next
// message.
const DefaultIdleTimeout = 2 * time.Minute

// MaxReceives bounds the receives a node runs at once; one more is
// refused with ResourceExhausted and retried by its sender later.
const MaxReceives = 8

// MaxGeneration bounds the generation a stream may carry: far above any
// a volume reaches (one per move or failover), far below where adding one
// would overflow.
const MaxGeneration = 1 << 48

// MaxGenerationLead bounds how far a stream's generation may be above the
// generation this node's promise record holds of the volume
// (refuseUnknownGeneration). A legitimate generation G was promised by a
// majority before any copy carried it (docs/safety.md, "Generations"), so
// a node either promised it too, or missed the reservations since its
// last grant: one per move or failover, far fewer than this while it was
// away. A header is the sender's word only: without the bound, a peer
// holding a node certificate could plant a replica at MaxGeneration,
// after which every promotion would need MaxGeneration+1, refused by
// every receiver. The bound is measured from the record alone, never
// from a replica's label, which a peer's earlier stream set: measured
// from that, a liar's streams would raise it stream after stream
// (docs/safety.md, "What a peer's header may decide").
const MaxGenerationLead = 1 << 20

// Index is the node's index of its copies (volume.Index): it is told
// the volume of every receive that took the copy's lock, done or not (it
// may have made, replaced or left a resumable replica), while the lock
// is still held, so that a reader after the unlock sees the change: the
// node's volumes version moves, the schedule learns the replica at its
// next round, and the CSI snapshots the stream brought are indexed.
type Index interface {
	Received(volumeID string)
}

// NewReceiver returns the replication service for the node whose volumes
// live under root, whose copies locks guards and index indexes
// (the node's copy locks, and the volume Manager's Index; a nil index is
// told nothing);
// replicas keep the newest keep replication snapshots.
func NewReceiver(z Pool, locks *copylock.Locks, index Index, root, nodeID string, keep int, log hclog.Logger) *Receiver {
	return &Receiver{z: z, locks: locks, index: index, replicas: copyrecord.NewReplicas(z, root), root: root, nodeID: nodeID, keep: keep, log: log,
		IdleTimeout: DefaultIdleTimeout, MinRate: DefaultMinRate, slots: make(chan struct{}, MaxReceives)}
}

// ReplicaState says what this node holds of volumeID, for a push that
// plans its stream.
func (r *Receiver) ReplicaState(ctx context.Context, volumeID string) (ReplicaState, error) {
	fs, err := dataset(r.root, volumeID)
	if err != nil {
		return ReplicaState{}, err
	}
	resp, err := r.copyState(ctx, fs)
	if err != nil || !resp.Exists {
		return resp, err
	}
	snaps, err := r.z.Snapshots(ctx, fs)
	if err != nil {
		return ReplicaState{}, err
	}
	for _, s := range snaps {
		resp.SnapshotGUIDs = append(resp.SnapshotGUIDs, s.GUID)
	}
	return resp, nil
}

// Resumable says whether this node's copy of volumeID holds an
// interrupted receive that a push can resume (its resume token), without
// listing its snapshots.
func (r *Receiver) Resumable(ctx context.Context, volumeID string) (bool, error) {
	fs, err := dataset(r.root, volumeID)
	if err != nil {
		return false, err
	}
	return r.replicas.Partial(ctx, fs)
}

// copyState is the state of the copy at fs without its snapshots, which
// take a listing to read.
func (r *Receiver) copyState(ctx context.Context, fs string) (ReplicaState, error) {
	props, err := r.z.Properties(ctx, fs, copyrecord.PropRole, "receive_resume_token", copyrecord.PropGeneration)
	if errors.Is(err, zfs.ErrNotFound) {
		return ReplicaState{NodeID: r.nodeID}, nil
	}
	if err != nil {
		return ReplicaState{}, err
	}
	token := props["receive_resume_token"]
	resp := ReplicaState{Exists: true, Role: props[copyrecord.PropRole], NodeID: r.nodeID}
	resp.Generation, _ = strconv.ParseUint(props[copyrecord.PropGeneration], 10, 64)
	if token != "-" && token != "" {
		resp.ResumeToken = token
	}
	return resp, nil
}

// Receive takes in one stream from a peer, in. sender is the node the
// sender's verified certificate names ("" without TLS); ctx ends when the
// sender hangs up.
func (r *Receiver) Receive(ctx context.Context, sender string, in Incoming) (Received, error) {
	// Every wait for the sender's next message, the header's included, is
	// bounded by the stall guard; when it runs out, ctx ends with errIdle
	// or errSlow and so does zfs receive (returning ends the stream and
	// unblocks its reader).
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	guard := newStallGuard(r.IdleTimeout, r.MinRate, cancel)
	defer guard.stop()
	h, err := r.readHeader(ctx, sender, in, guard)
	if err != nil {
		return Received{}, err
	}
	volumelog.Learn(h.VolumeID, h.VolumeName)
	s := &inbound{h: h, in: in, guard: guard,
		log: r.log.With("volume_id", h.VolumeID, "source_node", h.SourceNodeID, "kind", h.Kind, "snapshot", h.Snapshot)}
	s.fs, _ = dataset(r.root, h.VolumeID) // checked in readHeader
	select {
	case r.slots <- struct{}{}:
		defer func() { <-r.slots }()
	default:
		return Received{}, errdefs.Wrap(errdefs.ErrResourceExhausted, "node %s is receiving %d streams already; retry later", r.nodeID, MaxReceives)
	}
	if err := r.open(ctx, s); err != nil {
		return Received{}, err
	}
	return r.receiveLocked(ctx, s)
}

// inbound is one stream being received: what its header says, where it
// goes, and what was read of it and of the copy before the copy's lock.
type inbound struct {
	h     Header
	fs    string
	in    Incoming
	guard *stallGuard
	log   hclog.Logger
	// begin is the stream's first record; found the copy as read without
	// its lock, after mark (free: nobody held the lock then).
	begin []byte
	found copyRead
	mark  uint64
	free  bool
}

// open reads what the copy holds and the stream's first record, without
// the copy's lock. The copy is read while the sender starts zfs send (a
// process start, the longest wait before its first record), and
// whatever the header alone refuses is refused now: a stream into a
// primary never waits for its first record, and never takes the
// primary's lock (docs/safety.md, "A receive and the lock"). The lock is
// taken only once the first record is in hand, so a sender that stalls
// before it holds no lock at all.
func (r *Receiver) open(ctx context.Context, s *inbound) error {
	s.mark, s.free = r.locks.Mark(s.h.VolumeID)
	s.found = r.readCopy(ctx, s.fs)
	if err := r.refuseOnHeader(ctx, s.h, s.found); err != nil {
		s.log.Warn("stream refused before its first record", "error", err)
		return err
	}
	// The stream's own first record, read before anything is touched:
	// what the stream does is decided by it, not by the header.
	begin, err := readBegin(ctx, s.in, s.guard)
	if err != nil {
		return fmt.Errorf("the stream of volume %s: %w", s.h.VolumeID, err)
	}
	if err := checkBegin(begin, s.h.Kind); err != nil {
		return fmt.Errorf("the stream of volume %s: %w", s.h.VolumeID, err)
	}
	s.begin = begin
	return nil
}

// receiveLocked receives the opened stream under the copy's lock.
func (r *Receiver) receiveLocked(ctx context.Context, s *inbound) (Received, error) {
	h, fs, log := s.h, s.fs, s.log
	// The lock may be held by the tidy after the previous receive (a
	// second or so): a push that lands then waits for it rather than
	// failing. Another change of the copy that outlasts
	// copylock.DefaultWait (a receive) makes it Aborted.
	unlock, err := r.locks.Lock(ctx, h.VolumeID, "receive from node "+h.SourceNodeID)
	if err != nil {
		return Received{}, err
	}
	defer unlock()
	if r.index != nil {
		defer r.index.Received(h.VolumeID) // before the unlock: a reader after it sees the change noted
	}
	// zfs receive into the replica, for the streams that go there as they
	// are (an incremental, a resumed one), starts while the copy is
	// checked; it reads the first record before it changes anything, so
	// one that is not fed ends without a trace.
	var early *pendingReceive
	if k := h.Kind; k == KindIncremental || k == KindResume {
		if early, err = r.startReceive(ctx, fs, nil); err != nil {
			return Received{}, err
		}
		defer func() { early.abandon() }() // unless it was used
	}
	found, err := r.readLocked(ctx, fs, h.VolumeID, s.found, s.mark, s.free, log)
	if err != nil {
		return Received{}, err
	}
	parsed, _ := parseBegin(s.begin) // checked by open
	into, err := r.prepare(ctx, fs, h, parsed.fromGUID, found, log)
	if err != nil {
		return Received{}, err
	}
	log.Info("receiving", "into", into.target)
	zr, err := r.receiveInto(ctx, early, into)
	early = nil // used or abandoned
	if err != nil {
		return Received{}, err
	}
	// The guard runs only while the receiver waits for the sender: not
	// during the checks and clean-up above (the sender is held by flow
	// control meanwhile), nor after its last message, after which zfs
	// receive may still take its time to finish.
	received, err := r.zfsReceive(ctx, h, zr, into.replacing, s.begin, s.in, s.guard, log)
	if err != nil {
		if into.replacing {
			// A replacement is not resumed: the next push sends it whole
			// again, and the old replica stays as it was meanwhile.
			r.dropIncoming(ctx, into.target, log)
		}
		return Received{}, err
	}
	last, err := r.settleReceived(ctx, fs, h, into, log)
	if err != nil {
		return Received{}, err
	}
	go r.tidy(h.VolumeID, fs, last.Name, r.peerBases(h), log)
	log.Info("received", "bytes", received, "snapshot", last.Name)
	return Received{SnapshotGUID: last.GUID, Bytes: received}, nil
}

// readLocked returns the copy as it is under its lock. What was read
// without the lock (found) still holds when nobody took the lock since
// mark (every change of the copy holds it); otherwise it is read again
// (so is one that failed). A replacement that stopped half-way is
// finished first.
func (r *Receiver) readLocked(ctx context.Context, fs, id string, found copyRead, mark uint64, free bool, log hclog.Logger) (copyRead, error) {
	if !free || !r.locks.Unchanged(id, mark) || found.err != nil {
		found = r.readCopy(ctx, fs)
	}
	if found.replacing {
		if err := r.finishReplace(ctx, fs, log); err != nil {
			return copyRead{}, err
		}
		found = r.readCopy(ctx, fs)
	}
	return found, found.err
}

// receiveInto returns the zfs receive for into: early, the one started
// into the replica while the copy was checked, when into is that replica
// and sets no properties; else a new one, early abandoned.
func (r *Receiver) receiveInto(ctx context.Context, early *pendingReceive, into intoTarget) (*pendingReceive, error) {
	if early != nil && early.target == into.target && len(into.props) == 0 {
		return early, nil
	}
	early.abandon()
	return r.startReceive(ctx, into.target, into.props)
}

// pendingReceive is a zfs receive started and waiting on its pipe for the
// stream. An OS pipe hands the stream to zfs receive without another copy
// in between. When the stream breaks, closing the write end gives zfs
// receive an early EOF, and it keeps a resume token.
type pendingReceive struct {
	target string
	pw     *os.File
	done   chan error
}

func (r *Receiver) startReceive(ctx context.Context, target string, props map[string]string) (*pendingReceive, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	p := &pendingReceive{target: target, pw: pw, done: make(chan error, 1)}
	go func() {
		err := r.z.Receive(ctx, target, props, pr)
		pr.Close() // a writer still running now fails instead of blocking
		p.done <- err
	}()
	return p, nil
}

// abandon ends a receive that was never fed: without a first record zfs
// receive touches nothing. It waits for the end, so that nothing of it
// outlives its caller's lock.
func (p *pendingReceive) abandon() {
	if p == nil {
		return
	}
	p.pw.Close()
	<-p.done
}

// zfsReceive feeds zr with the first record already read and then the rest
// of the stream, and waits for it; it returns the bytes received.
func (r *Receiver) zfsReceive(ctx context.Context, h Header, zr *pendingReceive, replacing bool, begin []byte,
	in Incoming, guard *stallGuard, log hclog.Logger) (int64, error) {
	pw := zr.pw
	var received atomic.Int64
	received.Store(int64(len(begin)))
	limit := streamLimit(h.CapacityBytes, r.MaxQuota)
	var tooBig atomic.Bool
	go func() {
		defer pw.Close()
		if _, err := pw.Write(begin); err != nil {
			return
		}
		buf := make([]byte, readSize)
		for {
			guard.waiting()
			n, err := in.Read(buf)
			guard.got(n)
			if received.Add(int64(n)) > limit {
				tooBig.Store(true)
				return // zfs receive sees the stream end and fails
			}
			if _, werr := pw.Write(buf[:n]); werr != nil {
				return // zfs receive ended; its error is reported below
			}
			if err != nil {
				if err != io.EOF {
					log.Warn("stream from the sender broke", "error", err)
				}
				return
			}
		}
	}()
	started := time.Now()
	err := <-zr.done
	r.Metrics.transfer("in", h.Kind, h.SourceNodeID, received.Load(), time.Since(started), err)
	if cause := context.Cause(ctx); errors.Is(cause, errIdle) || errors.Is(cause, errSlow) {
		err = cause
	}
	if tooBig.Load() {
		// Not resumable: a resumed stream would count from zero again.
		if !replacing {
			if aerr := r.replicas.AbortPartial(context.WithoutCancel(ctx), zr.target); aerr != nil {
				log.Warn("discarding the partial receive of an oversized stream failed; the next receive retries", "error", aerr)
			}
		}
		log.Warn("stream refused: larger than the volume's capacity allows", "bytes_limit", limit, "capacity", h.CapacityBytes)
		return 0, errdefs.Wrap(errdefs.ErrInvalidArgument, "the stream of volume %s carries more than %d bytes, more than a volume of capacity %d (at most max_quota %d) can send: refused",
			h.VolumeID, limit, h.CapacityBytes, r.MaxQuota)
	}
	if errors.Is(err, zfs.ErrStreamUnsupported) {
		// Refused at the first record: nothing was received, and no retry
		// can succeed until the volume or this node changes.
		log.Error("stream refused: it uses a ZFS feature this node's OpenZFS lacks", "openzfs", r.OpenZFS, "error", err)
		return 0, errdefs.Wrap(errdefs.ErrFailedPrecondition,
			"node %s cannot receive volume %s from node %s: its OpenZFS (%s) lacks a feature the volume uses there (%v); keep the volume on nodes of the sender's OpenZFS release or newer, or upgrade this node (docs/install.md, \"Mixed versions\")",
			r.nodeID, h.VolumeID, h.SourceNodeID, cmp.Or(r.OpenZFS, "release unknown"), err)
	}
	if errors.Is(err, zfs.ErrNoSpace) {
		// Not busy: trying again finds no more room until someone makes
		// it; what arrived stays resumable.
		log.Error("receive failed: no room (the pool is full or a quota is reached); what arrived stays resumable", "bytes", received.Load(), "error", err)
		return 0, errdefs.Wrap(errdefs.ErrResourceExhausted, "%s has no room for volume %s (its pool is full or a quota is reached): %v; free space there, and the next push resumes",
			r.nodeID, h.VolumeID, err)
	}
	if err != nil {
		log.Warn("receive failed; an interrupted stream can be resumed", "bytes", received.Load(), "error", err)
		return 0, errdefs.Wrap(errdefs.ErrAborted, "receiving volume %s: %v", h.VolumeID, err)
	}
	return received.Load(), nil
}

// streamMargin is what a stream may carry beyond its volume's capacity:
// its own records, and the slack by which ZFS lets a quota be exceeded.
var streamMargin uint64 = 64 << 20

// streamLimit is the most bytes one stream of a volume of the capacity
// may carry on a node whose operator allows maxQuota (0: no bound). No
// snapshot references more than the volume's quota, and neither a full
// nor an incremental stream sends more than the snapshot references.
func streamLimit(capacity, maxQuota uint64) int64 {
	if maxQuota == 0 {
		return math.MaxInt64
	}
	if capacity == 0 || capacity > maxQuota {
		capacity = maxQuota
	}
	if capacity >= math.MaxInt64/2 {
		return math.MaxInt64 // beyond any pool; the sum would overflow
	}
	return int64(capacity + capacity/8 + streamMargin)
}

// errIdle ends a receive whose sender went quiet.
var errIdle = errors.New("the sender sent nothing for the idle timeout")
