package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/node/copylock"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// tidyStreams records a tidy's holds on a primary, or on nothing when
// gone is set.
type tidyStreams struct {
	Pool
	gone  atomic.Bool
	holds atomic.Int32
}

func (s *tidyStreams) Property(_ context.Context, _, prop string) (string, error) {
	if s.gone.Load() {
		return "", zfs.ErrNotFound
	}
	return contract.RolePrimary, nil
}

func (s *tidyStreams) Hold(context.Context, string, string) error {
	s.holds.Add(1)
	return nil
}
func (s *tidyStreams) Release(context.Context, string, string) error { return nil }
func (s *tidyStreams) Holds(context.Context, string) (map[string][]string, error) {
	return nil, nil
}
func (s *tidyStreams) Snapshots(context.Context, string) ([]zfs.Snap, error) { return nil, nil }

// TestTidyWaitsForTheCopyLock: the tidy after a push holds and prunes the
// copy's snapshots only under the copy's lock, so a delete holding it
// never meets a tidy under it; after the delete, the tidy finds no
// primary and does nothing.
func TestTidyWaitsForTheCopyLock(t *testing.T) {
	ctx := context.Background()
	z := &tidyStreams{}
	locks := new(copylock.Locks)
	p := NewPusher(z, locks, "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
	const id = "vol-0123456789abcdef0123"
	fs := "tank/nomad/" + id

	unlock, err := locks.Lock(ctx, id, "delete")
	if err != nil {
		t.Fatal(err)
	}
	p.startTidy(id, fs, fs+"@zn-1", "n2", hclog.NewNullLogger())
	time.Sleep(200 * time.Millisecond)
	if n := z.holds.Load(); n != 0 {
		t.Fatalf("the tidy held %d snapshots while a delete held the copy's lock", n)
	}
	z.gone.Store(true)
	unlock()
	time.Sleep(200 * time.Millisecond)
	if n := z.holds.Load(); n != 0 {
		t.Errorf("the tidy held %d snapshots of a deleted volume", n)
	}

	z.gone.Store(false)
	p.startTidy(id, fs, fs+"@zn-2", "n2", hclog.NewNullLogger())
	deadline := time.Now().Add(5 * time.Second)
	for z.holds.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if z.holds.Load() == 0 {
		t.Error("the tidy of a primary with a free lock held nothing")
	}
}

// TestTidyKeepsAnotherPeersUnheldBase: tidies after pushes to different
// peers run in either order. When the tidy after a push to n2 runs before
// the one after the earlier push to n3, n3's base is sent but not yet
// held, and pruning it would leave n3 sharing no snapshot with the
// primary (a full resend; seen as a flaky TestReplicasShareABase).
func TestTidyKeepsAnotherPeersUnheldBase(t *testing.T) {
	const id = "vol-0123456789abcdef0123"
	fs := "tank/nomad/" + id
	z := newMemPool()
	z.put(fs, nil, "zn-1:1", "zn-2:2", "zn-3:3")
	p := NewPusher(z, new(copylock.Locks), "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
	p.noteSent(id, "n3", fs+"@zn-1") // its tidy has not run yet
	p.noteSent(id, "n2", fs+"@zn-2")

	p.tidy(context.Background(), id, fs, fs+"@zn-2", "n2", hclog.NewNullLogger())

	var left []string
	for _, s := range z.dataset(fs).snaps {
		left = append(left, s.Name)
	}
	if !slices.Contains(left, fs+"@zn-1") {
		t.Errorf("the tidy after a push to n2 pruned n3's base, sent but not yet held: left %v", left)
	}
	if got := p.sentTo(id); got["n3"] != fs+"@zn-1" || got["n2"] != "" {
		t.Errorf("sent record after n2's tidy: %v, want n3's only", got)
	}
}

// TestOneTransferPerVolume: a push while another of the volume runs is
// Aborted, before it touches the copy.
func TestOneTransferPerVolume(t *testing.T) {
	locks := new(copylock.Locks)
	p := NewPusher(&tidyStreams{}, locks, "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
	const id = "vol-0123456789abcdef0123"
	_, end, err := locks.StartTransfer(context.Background(), id, "a push to n3")
	if err != nil {
		t.Fatal(err)
	}
	defer end()
	_, err = p.Push(context.Background(), id, "n2:1", 0, func(Progress) {})
	if status.Code(errdefs.ToStatus(err)) != codes.Aborted || !errors.Is(err, copylock.ErrTransferRunning) {
		t.Errorf("a second push: %v, want Aborted naming the running one", err)
	}
}

// TestARefusedStreamLeavesNoSnapshot: a receiver's refusal at admission
// (its replica's state, the header, the first record) means it received
// nothing of the stream, so the push's snapshot goes again as unsent; a
// broken or failed stream may have left a resumable partial receive, so
// the snapshot stays.
func TestARefusedStreamLeavesNoSnapshot(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("sending volume v to n3: %w", errdefs.Wrap(errdefs.ErrFailedPrecondition, "the replica holds 1 snapshot(s) after the stream's base")), true},
		{errdefs.Wrap(errdefs.ErrPermissionDenied, "the certificate names n9"), true},
		{errdefs.Wrap(errdefs.ErrInvalidArgument, "not a stream"), true},
		{errdefs.Wrap(errdefs.ErrAborted, "busy, or failed to receive"), false},
		{errdefs.Wrap(errdefs.ErrUnavailable, "the link broke"), false},
		{errors.New("the peer received another snapshot"), false},
	}
	for _, tt := range tests {
		if got := refusedWhole(tt.err); got != tt.want {
			t.Errorf("refusedWhole(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

func TestReceiverSaidWhy(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{errdefs.FromStatus(status.Error(codes.Aborted, "a receive of volume v is running; retry")), true},
		{errdefs.FromStatus(status.Error(codes.FailedPrecondition, "refusing to overwrite a primary")), true},
		{errdefs.FromStatus(status.Error(codes.Unavailable, "connection reset")), false},
		{errdefs.FromStatus(status.Error(codes.Canceled, "context canceled")), false},
		{errdefs.FromStatus(status.Error(codes.Internal, "zfs receive failed")), false},
		{errors.New("EOF"), false},
		{nil, false},
	}
	for _, tt := range tests {
		if got := receiverSaidWhy(tt.err); got != tt.want {
			t.Errorf("receiverSaidWhy(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// tokenStreams decodes every resume token to info and lists snaps.
type tokenStreams struct {
	Pool
	info  zfs.ResumeInfo
	err   error
	snaps []zfs.Snap
}

func (z *tokenStreams) ResumeToken(context.Context, string) (zfs.ResumeInfo, error) {
	return z.info, z.err
}

func (z *tokenStreams) Snapshots(context.Context, string) ([]zfs.Snap, error) { return z.snaps, nil }

// TestResumeTokensAreChecked: a receiver's resume token is used only when
// it asks for a snapshot of the very volume being pushed that this node
// still has, from one of its snapshots, raw when the volume is sent raw;
// any other token gives a fresh send instead (the receiver then discards
// its partial receive).
func TestResumeTokensAreChecked(t *testing.T) {
	const fs = "tank/nomad/" + testVolume
	snaps := []zfs.Snap{{Name: fs + "@zn-1", GUID: 1}, {Name: fs + "@zn-2", GUID: 2}, {Name: fs + "@zn-3", GUID: 3}}
	tests := []struct {
		name   string
		info   zfs.ResumeInfo
		err    error
		raw    bool
		resume bool
	}{
		{"a full stream of this volume", zfs.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2}, nil, false, true},
		{"an incremental of this volume", zfs.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2, FromGUID: 1}, nil, false, true},
		{"raw, for an encrypted volume", zfs.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2, Raw: true}, nil, true, true},
		{"another volume's snapshot", zfs.ResumeInfo{ToName: "tank/nomad/vol-ffffffffffffffffffff@zn-2", ToGUID: 2}, nil, false, false},
		{"a dataset outside the root", zfs.ResumeInfo{ToName: "tank/secrets@daily", ToGUID: 2}, nil, false, false},
		{"a snapshot pruned here", zfs.ResumeInfo{ToName: fs + "@zn-0", ToGUID: 99}, nil, false, false},
		{"a name with another snapshot's guid", zfs.ResumeInfo{ToName: fs + "@zn-1", ToGUID: 2}, nil, false, false},
		{"a base that is not this volume's", zfs.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2, FromGUID: 77}, nil, false, false},
		{"plaintext of an encrypted volume", zfs.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2}, nil, true, false},
		{"a token that does not decode", zfs.ResumeInfo{}, errors.New("bad token"), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := &tokenStreams{info: tt.info, err: tt.err, snaps: snaps}
			p := NewPusher(z, new(copylock.Locks), "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
			state := ReplicaState{Exists: true, Role: RoleReplica, Generation: 1, ResumeToken: "1-abc-10-789c", SnapshotGUIDs: []uint64{1}}
			plan, err := p.plan(context.Background(), fs, state, Header{Generation: 1}, tt.raw, fs+"@zn-3", nil, p.listAhead(context.Background(), fs), hclog.NewNullLogger())
			if err != nil {
				t.Fatal(err)
			}
			if resumed := plan.spec.ResumeToken != ""; resumed != tt.resume {
				t.Errorf("resumed = %v, want %v (plan %+v)", resumed, tt.resume, plan)
			}
			if !tt.resume && (plan.prog.Kind != KindIncremental || plan.spec.Base != fs+"@zn-1" || plan.spec.Snapshot != fs+"@zn-3") {
				t.Errorf("instead of resuming: %+v, want an incremental from zn-1 to zn-3", plan)
			}
		})
	}
}

// TestPlanChoosesTheKind: an incremental from the newest common snapshot,
// unless the peer's replica is of an older generation and holds snapshots
// after it that this node lacks. Then, when this copy's history vouches
// for that generation (planned moves since), still the incremental: the
// receiver rolls those earlier states back. Otherwise (a failover
// promoted a staler copy since) a full stream, which replaces the replica
// and sets it aside, instead of an incremental that zfs receive refuses on
// every push.
func TestPlanChoosesTheKind(t *testing.T) {
	const fs = "tank/nomad/" + testVolume
	local := []zfs.Snap{{Name: fs + "@zn-1", GUID: 1}, {Name: fs + "@zn-2", GUID: 2}, {Name: fs + "@zn-3", GUID: 3}}
	tests := []struct {
		name        string
		generation  uint64 // the peer's; this node's is 3
		historyFrom uint64 // this node's
		remote      []uint64
		want        string // a kind, or "" for a refusal
		base        string
	}{
		{"the peer's newest is common", 3, 3, []uint64{1, 2}, KindIncremental, "zn-2"},
		{"an older generation's replica that is behind", 2, 3, []uint64{1}, KindIncremental, "zn-1"},
		{"a replica ahead of this node after a failover", 2, 3, []uint64{1, 99}, KindFull, ""},
		{"a replica ahead of this node after planned moves", 2, 1, []uint64{1, 99}, KindIncremental, "zn-1"},
		{"a replica ahead from before a failover then a move", 1, 2, []uint64{1, 99}, KindFull, ""},
		{"a replica ahead from the generation the history starts at", 2, 2, []uint64{2, 98, 99}, KindIncremental, "zn-2"},
		{"an older generation's replica with nothing in common", 1, 1, []uint64{98, 99}, KindFull, ""},
		{"this generation's replica with nothing in common", 3, 1, []uint64{98, 99}, "", ""},
		{"this generation's replica ahead of this node", 3, 1, []uint64{1, 99}, KindIncremental, "zn-1"},
		{"an interrupted first receive, not resumed", 3, 3, nil, KindFull, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPusher(&tokenStreams{snaps: local}, new(copylock.Locks), "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
			state := ReplicaState{Exists: true, Role: RoleReplica, Generation: tt.generation, SnapshotGUIDs: tt.remote}
			h := Header{Generation: 3, HistoryFrom: tt.historyFrom}
			plan, err := p.plan(context.Background(), fs, state, h, false, fs+"@zn-3", nil, p.listAhead(context.Background(), fs), hclog.NewNullLogger())
			if tt.want == "" {
				if err == nil {
					t.Errorf("planned %+v, want a refusal", plan)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if plan.prog.Kind != tt.want || (tt.base != "" && plan.spec.Base != fs+"@"+tt.base) {
				t.Errorf("planned %+v, want %s from %q", plan, tt.want, tt.base)
			}
		})
	}
}

// TestARefusedRollbackIsSentInFull: a receiver that missed the
// reservation of this node's generation refuses to roll its replica's
// later snapshots back (FailedPrecondition): its own promise record does
// not say they are superseded. The next push to that replica, while its
// newest snapshot is the same, sends in full, which the receiver takes in
// beside the replica and then sets the old one aside, instead of the
// same refusal on every push. Any other outcome leaves the plan as it
// was.
func TestARefusedRollbackIsSentInFull(t *testing.T) {
	const fs = "tank/nomad/" + testVolume
	local := []zfs.Snap{{Name: fs + "@zn-1", GUID: 1}, {Name: fs + "@zn-2", GUID: 2}, {Name: fs + "@zn-3", GUID: 3}}
	refused := errdefs.FromStatus(status.Error(codes.FailedPrecondition, "no generation promised to node n1 supersedes them"))
	tests := []struct {
		name   string
		before func(p *Pusher, rollback sendPlan)
		remote []uint64 // the replica's snapshots at the next push
		want   string
	}{
		{"the rollback was refused", func(p *Pusher, plan sendPlan) { p.noteRollback(fs, "n2", plan, refused) }, []uint64{1, 99}, KindFull},
		{"nothing refused", func(*Pusher, sendPlan) {}, []uint64{1, 99}, KindIncremental},
		{"the push broke for another reason", func(p *Pusher, plan sendPlan) {
			p.noteRollback(fs, "n2", plan, errdefs.Wrap(errdefs.ErrAborted, "the receive of volume %s is busy", testVolume))
		}, []uint64{1, 99}, KindIncremental},
		{"the replica changed since the refusal", func(p *Pusher, plan sendPlan) { p.noteRollback(fs, "n2", plan, refused) }, []uint64{1, 98}, KindIncremental},
		{"another peer refused", func(p *Pusher, plan sendPlan) { p.noteRollback(fs, "n3", plan, refused) }, []uint64{1, 99}, KindIncremental},
		{"a push succeeded since", func(p *Pusher, plan sendPlan) {
			p.noteRollback(fs, "n2", plan, refused)
			p.noteRollback(fs, "n2", sendPlan{}, nil)
		}, []uint64{1, 99}, KindIncremental},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := NewPusher(&tokenStreams{snaps: local}, new(copylock.Locks), "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
			h := Header{Generation: 3, HistoryFrom: 1} // planned moves since the replica's generation 2
			plan := func(remote []uint64) sendPlan {
				t.Helper()
				state := ReplicaState{Exists: true, Role: RoleReplica, NodeID: "n2", Generation: 2, SnapshotGUIDs: remote}
				out, err := p.plan(context.Background(), fs, state, h, false, fs+"@zn-3", nil, p.listAhead(context.Background(), fs), hclog.NewNullLogger())
				if err != nil {
					t.Fatal(err)
				}
				return out
			}
			first := plan([]uint64{1, 99})
			if first.prog.Kind != KindIncremental || first.rollback != 99 {
				t.Fatalf("the first push planned %+v, want an incremental that rolls back the replica's newest (guid 99)", first)
			}
			tt.before(p, first)
			if next := plan(tt.remote); next.prog.Kind != tt.want {
				t.Errorf("the next push planned %s (%+v), want %s", next.prog.Kind, next, tt.want)
			}
		})
	}
}
