package faultsim

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/node/replication"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// A lying peer (Config.LyingPeers): something holding node liar's valid
// certificate sends node victim a forged stream of a volume, one of the
// lies docs/safety.md's fault model names. Each must be refused; a lie
// accepted is a violation at once, and what a refused one may have
// changed on the way is left to the invariants after the step.
type lie struct {
	name   string
	header func(h *pb.ReceiveHeader)
	kind   string // of the stream sent
	want   codes.Code
}

// lies are the forgeries that fit the victim's copy of the volume.
func lies(liar, other string, role string, generation uint64) []lie {
	out := []lie{
		{"claims to come from " + other, func(h *pb.ReceiveHeader) { h.SourceNodeId = other }, replication.KindFull, codes.PermissionDenied},
		{"an absurd generation", func(h *pb.ReceiveHeader) { h.Generation = replication.MaxGeneration + 1 }, replication.KindFull, codes.InvalidArgument},
		// A replica planted at a generation no majority promised: every
		// promotion after it would need one above it.
		{"a planted replica at the highest generation", func(h *pb.ReceiveHeader) { h.Generation, h.HistoryFrom = replication.MaxGeneration, 1 }, replication.KindFull, codes.FailedPrecondition},
	}
	// A name label is the sender's word, and a replica of a volume the
	// victim never heard of is a push like any other: accepted. What
	// must not follow it is an operator's command by name
	// (operatorNames).
	out = append(out, lie{"a replica of another volume under this one's name", func(h *pb.ReceiveHeader) {
		h.VolumeId, h.Generation = contract.VolumeIDForName("forged-"+h.VolumeName), 1
	}, replication.KindFull, codes.OK})
	switch {
	case role == contract.RolePrimary:
		out = append(out, lie{"a full stream over the primary", func(h *pb.ReceiveHeader) { h.Generation = generation + 1 }, replication.KindFull, codes.FailedPrecondition})
	case role == contract.RoleReplica && generation > 1:
		out = append(out, lie{"an incremental lowering the replica's generation", func(h *pb.ReceiveHeader) { h.Generation = generation - 1 }, replication.KindIncremental, codes.FailedPrecondition})
	}
	return out
}

func (w *world) lie(v *simVolume, liar, victim *simNode) {
	// The liar is the process on node liar (a compromised zfs-node): it
	// lies while that node is up.
	if !v.created || liar == victim || victim.inc == nil || liar.inc == nil {
		return
	}
	fs := rootDataset + "/" + v.id
	role, generation := "", uint64(0)
	if victim.pool.NativeProperty(fs, "type") != "" || w.checker.user(victim, fs, copyrecord.PropRole) != "" {
		role = w.checker.user(victim, fs, copyrecord.PropRole)
		generation, _ = strconv.ParseUint(w.checker.user(victim, fs, copyrecord.PropGeneration), 10, 64)
	}
	other := w.nodes[0].id
	for _, n := range w.nodes {
		if n != liar {
			other = n.id
			break
		}
	}
	if role == contract.RoleReplica && w.dice.intn(2) == 0 && w.rollbackLie(v, liar, victim, generation) {
		return
	}
	options := lies(liar.id, other, role, generation)
	l := options[w.dice.intn(len(options))]
	streams, err := forgedStreams(v.id, w.cfg.Seed)
	if err != nil {
		panic(err) // a scratch fake always makes them
	}
	h := &pb.ReceiveHeader{VolumeId: v.id, VolumeName: v.name, SourceNodeId: liar.id, Generation: max(generation, 1),
		Kind: l.kind, Snapshot: "zn-1", CapacityBytes: 1 << 30}
	if l.kind == replication.KindIncremental {
		h.Snapshot = "zn-2"
	}
	l.header(h)
	err = w.sendForged(liar, victim, h, streams[l.kind])
	w.tracef("%s lies to %s about %s: %s: %v", liar.id, victim.id, v.name, l.name, errText(err))
	switch {
	case err == nil && l.want == codes.OK:
		w.stats.ForgedNames++
	case err == nil:
		w.checker.late(fmt.Errorf("node %s accepted a lying peer's stream of volume %s (%s)", victim.id, v.id, l.name))
	case status.Code(err) == l.want:
		w.stats.LiesRefused++
	}
}

// rollbackLie: liar, a node with its own copy of
// v, sends victim's replica a genuine incremental from a snapshot both
// hold that is not the replica's newest, labelled one generation above
// the replica's with a history claiming to cover it. Received, it would
// roll back (destroy) the replica's later snapshots, which may hold
// writes no other copy has. Only victim's own promise record, promising
// liar a generation above the replica's, lets a stream roll back; a
// header is the sender's word. It reports whether the copies allowed the
// lie (a shared snapshot before the replica's newest, a later one on
// liar) and it was sent.
func (w *world) rollbackLie(v *simVolume, liar, victim *simNode, generation uint64) bool {
	ctx, cancel := opContext()
	defer cancel()
	fs := rootDataset + "/" + v.id
	theirs, err := victim.pool.Snapshots(ctx, fs)
	if err != nil || len(theirs) < 2 {
		return false
	}
	mine, err := liar.pool.Snapshots(ctx, fs)
	if err != nil {
		return false
	}
	shared := map[uint64]bool{}
	for _, s := range theirs[:len(theirs)-1] { // the replica's newest is no rollback
		shared[s.GUID] = true
	}
	base := -1
	for i, s := range mine {
		if shared[s.GUID] {
			base = i
		}
	}
	if base < 0 || base == len(mine)-1 || w.promisedTo(victim, v.id, liar.id, generation) {
		return false
	}
	var stream bytes.Buffer
	spec := zfs.SendSpec{Snapshot: mine[len(mine)-1].Name, Base: mine[base].Name}
	if _, err := liar.pool.Send(ctx, spec, &stream); err != nil {
		return false
	}
	h := &pb.ReceiveHeader{VolumeId: v.id, VolumeName: v.name, SourceNodeId: liar.id, Kind: replication.KindIncremental,
		Snapshot: copyrecord.ShortSnapshotName(spec.Snapshot), Generation: generation + 1, HistoryFrom: 1, CapacityBytes: 1 << 30}
	err = w.sendForged(liar, victim, h, stream.Bytes())
	w.tracef("%s lies to %s about %s: an incremental from %s, older than the replica's newest, at generation %d: %v",
		liar.id, victim.id, v.name, copyrecord.ShortSnapshotName(spec.Base), h.Generation, errText(err))
	switch {
	case err == nil && !w.promisedTo(victim, v.id, liar.id, generation):
		w.checker.late(fmt.Errorf("node %s rolled back its replica of volume %s for node %s's incremental, which its promise record does not supersede", victim.id, v.id, liar.id))
	case status.Code(err) == codes.FailedPrecondition:
		w.stats.LiesRefused++
		w.stats.RollbacksRefused++
	}
	return true
}

// promisedTo reports whether node n's promise record of volume id
// promises holder a generation above generation: a move or failover to
// holder is under way, and its stream may roll the replica back. It
// reads the record as the pool holds it, through the checker, not
// through volume.Records.Promised: the oracle judges the node's code, so
// it does not share that code's reading (the shard, then the root's
// legacy place).
func (w *world) promisedTo(n *simNode, id, holder string, generation uint64) bool {
	p, ok := w.promise(n, id)
	return ok && p.Holder == holder && p.Generation > generation
}

// promise is node n's promise record of volume id as its pool holds it:
// in the volume's shard, else in the root's legacy place.
func (w *world) promise(n *simNode, id string) (copyrecord.Promise, bool) {
	for _, ds := range []string{copyrecord.PromiseShard(rootDataset, id), rootDataset} {
		if v := w.checker.user(n, ds, copyrecord.PropPromisePrefix+id); v != "" {
			return copyrecord.ParsePromise(v), true
		}
	}
	return copyrecord.Promise{}, false
}

// sendForged sends a forged stream from liar's identity to victim and
// returns the receiver's answer.
func (w *world) sendForged(liar, victim *simNode, h *pb.ReceiveHeader, data []byte) error {
	conn, err := grpc.NewClient(victim.addr(), w.net.dialOptions(liar.id, func() bool { return true })...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := opContext()
	defer cancel()
	stream, err := pb.NewReplicationClient(conn).Receive(ctx)
	if err != nil {
		return err
	}
	msgs := []*pb.ReceiveMessage{{Msg: &pb.ReceiveMessage_Header{Header: h}}, {Msg: &pb.ReceiveMessage_Data{Data: data}}}
	for _, m := range msgs {
		if err := stream.Send(m); errors.Is(err, io.EOF) {
			break // the receiver answered already: CloseAndRecv reads it
		} else if err != nil {
			return err
		}
	}
	_, err = stream.CloseAndRecv()
	return err
}

// forgedStreams are real streams of a scratch pool's copy of volume id: a
// full one of zn-1 and an incremental from zn-1 to zn-2.
func forgedStreams(id string, seed uint64) (map[string][]byte, error) {
	ctx := context.Background()
	scratch := zfsfake.New(1<<30, "tank")
	scratch.GUIDSeed = guidSeed(seed, "liar")
	fs := rootDataset + "/" + id
	for _, step := range []func() error{
		func() error { return scratch.CreateFilesystem(ctx, rootDataset, nil) },
		func() error { return scratch.CreateFilesystem(ctx, fs, nil) },
		func() error { return scratch.Write(fs, "forged") },
		func() error { return scratch.Snapshot(ctx, fs+"@zn-1", nil) },
		func() error { return scratch.Write(fs, "forged-more") },
		func() error { return scratch.Snapshot(ctx, fs+"@zn-2", nil) },
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	out := map[string][]byte{}
	for kind, spec := range map[string]zfs.SendSpec{
		replication.KindFull:        {Snapshot: fs + "@zn-1"},
		replication.KindIncremental: {Snapshot: fs + "@zn-2", Base: fs + "@zn-1"},
	} {
		var b bytes.Buffer
		if _, err := scratch.Send(ctx, spec, &b); err != nil {
			return nil, err
		}
		out[kind] = b.Bytes()
	}
	return out, nil
}

// stallSteps bounds, in steps, how long a stalling liar sends nothing.
const stallSteps = 40

// stall is a lying peer that stalls mid-receive: it
// sends victim the header of a stream of v one generation above the
// victim's copy, and half the time the stream's first record, then
// nothing for 3 to stallSteps steps. It stalls at the node of v's job
// when v runs (the primary a self-fence must reach), and reaches the
// victim past every cut: what holds liar's certificate may sit on the
// victim's side of a split. The receiver must take no primary's lock
// for it, and hold a replica's only until its stall guard ends the
// receive; the self-fence, a stage or a promote of v meanwhile waits at
// most the lock's wait, which the checker's invariants then judge.
func (w *world) stall(v *simVolume, liar, victim *simNode) {
	if v.alloc != "" {
		victim = w.node(v.alloc)
	}
	if !v.created || liar == victim || victim.inc == nil {
		return
	}
	w.stallUntil(v, liar, victim, w.step+3+w.dice.intn(stallSteps-2), w.dice.chance(0.5))
}

// stallUntil is stall's stream, which sends nothing more until step
// until: its header, and with firstRecord the stream's first record.
func (w *world) stallUntil(v *simVolume, liar, victim *simNode, until int, firstRecord bool) {
	fs := rootDataset + "/" + v.id
	generation, _ := strconv.ParseUint(w.checker.user(victim, fs, copyrecord.PropGeneration), 10, 64)
	h := &pb.ReceiveHeader{VolumeId: v.id, VolumeName: v.name, SourceNodeId: liar.id, Generation: generation + 1,
		Kind: replication.KindFull, Snapshot: "zn-1", CapacityBytes: 1 << 30}
	msgs := []*pb.ReceiveMessage{{Msg: &pb.ReceiveMessage_Header{Header: h}}}
	what := "its header"
	if firstRecord {
		streams, err := forgedStreams(v.id, w.cfg.Seed)
		if err != nil {
			panic(err) // a scratch fake always makes them
		}
		full := streams[replication.KindFull]
		first := full[:min(312, len(full))] // a begin record (replication's beginRecordSize)
		msgs = append(msgs, &pb.ReceiveMessage{Msg: &pb.ReceiveMessage_Data{Data: first}})
		what = "its header and first record"
	}
	conn, err := grpc.NewClient(victim.addr(), w.net.directDialOptions(liar.id)...)
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := pb.NewReplicationClient(conn).Receive(ctx)
	for _, m := range msgs {
		if err == nil {
			err = stream.Send(m)
		}
	}
	w.tracef("%s stalls a stream of %s to %s after %s, until step %d: %v", liar.id, v.name, victim.id, what, until, errText(err))
	w.stats.Stalls++
	w.stalls.Add(1)
	go func() {
		defer w.stalls.Done()
		defer conn.Close()
		defer cancel()
		for w.stepNow.Load() < int64(until) {
			select {
			case <-w.done:
				return
			case <-time.After(time.Millisecond):
			}
		}
		w.tracef("%s's stalled stream of %s to %s ends", liar.id, v.name, victim.id)
	}()
}
