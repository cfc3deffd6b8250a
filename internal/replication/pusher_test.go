package replication

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/zfs/zfscmd"
	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

// stuckHold is a Streams whose Hold waits until its context ends, like a
// tidy caught in a slow pool sync.
type stuckHold struct {
	Streams
	entered chan struct{}
	calls   atomic.Int32
	ended   atomic.Bool
}

func (s *stuckHold) Hold(ctx context.Context, _, _ string) error {
	if s.calls.Add(1) == 1 {
		close(s.entered)
	}
	<-ctx.Done()
	s.ended.Store(true)
	return ctx.Err()
}

// TestHoldStopsAndWaitsForTidy: a delete (which holds transfers) must not
// run while the tidy after a push still holds or prunes the volume's
// snapshots.
func TestHoldStopsAndWaitsForTidy(t *testing.T) {
	z := &stuckHold{entered: make(chan struct{})}
	p := NewPusher(z, "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
	const id = "vol-0123456789abcdef0123"
	fs := "tank/nomad/" + id
	p.startTidy(id, fs, fs+"@zn-1", BaseHoldTag+"-n2", hclog.NewNullLogger())
	<-z.entered

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	release, err := p.Hold(ctx, id)
	if err != nil {
		t.Fatalf("Hold did not stop the tidy: %v", err)
	}
	defer release()
	if !z.ended.Load() {
		t.Fatal("Hold returned while the tidy still ran")
	}
	// While held, a tidy (of a push that raced the hold) is skipped.
	p.startTidy(id, fs, fs+"@zn-2", BaseHoldTag+"-n2", hclog.NewNullLogger())
	time.Sleep(100 * time.Millisecond)
	if n := z.calls.Load(); n != 1 {
		t.Errorf("a tidy ran while the volume was held (%d holds tried)", n)
	}
}

func TestReceiverSaidWhy(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Aborted, "a receive of volume v is running; retry"), true},
		{status.Error(codes.FailedPrecondition, "refusing to overwrite a primary"), true},
		{status.Error(codes.Unavailable, "connection reset"), false},
		{status.Error(codes.Canceled, "context canceled"), false},
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
	Streams
	info  zfscmd.ResumeInfo
	err   error
	snaps []zfscmd.Snap
}

func (z *tokenStreams) ResumeToken(context.Context, string) (zfscmd.ResumeInfo, error) {
	return z.info, z.err
}

func (z *tokenStreams) Snapshots(context.Context, string) ([]zfscmd.Snap, error) { return z.snaps, nil }

// TestResumeTokensAreChecked: a receiver's resume token is used only when
// it asks for a snapshot of the very volume being pushed that this node
// still has, from one of its snapshots, raw when the volume is sent raw;
// any other token gives a fresh send instead (the receiver then discards
// its partial receive).
func TestResumeTokensAreChecked(t *testing.T) {
	const fs = "tank/nomad/" + testVolume
	snaps := []zfscmd.Snap{{Name: fs + "@zn-1", GUID: 1}, {Name: fs + "@zn-2", GUID: 2}, {Name: fs + "@zn-3", GUID: 3}}
	tests := []struct {
		name   string
		info   zfscmd.ResumeInfo
		err    error
		raw    bool
		resume bool
	}{
		{"a full stream of this volume", zfscmd.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2}, nil, false, true},
		{"an incremental of this volume", zfscmd.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2, FromGUID: 1}, nil, false, true},
		{"raw, for an encrypted volume", zfscmd.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2, Raw: true}, nil, true, true},
		{"another volume's snapshot", zfscmd.ResumeInfo{ToName: "tank/nomad/vol-ffffffffffffffffffff@zn-2", ToGUID: 2}, nil, false, false},
		{"a dataset outside the root", zfscmd.ResumeInfo{ToName: "tank/secrets@daily", ToGUID: 2}, nil, false, false},
		{"a snapshot pruned here", zfscmd.ResumeInfo{ToName: fs + "@zn-0", ToGUID: 99}, nil, false, false},
		{"a name with another snapshot's guid", zfscmd.ResumeInfo{ToName: fs + "@zn-1", ToGUID: 2}, nil, false, false},
		{"a base that is not this volume's", zfscmd.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2, FromGUID: 77}, nil, false, false},
		{"plaintext of an encrypted volume", zfscmd.ResumeInfo{ToName: fs + "@zn-2", ToGUID: 2}, nil, true, false},
		{"a token that does not decode", zfscmd.ResumeInfo{}, errors.New("bad token"), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := &tokenStreams{info: tt.info, err: tt.err, snaps: snaps}
			p := NewPusher(z, "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
			state := &pb.ReplicaStateResponse{Exists: true, Role: RoleReplica, Generation: 1, ResumeToken: "1-abc-10-789c", SnapshotGuids: []uint64{1}}
			plan, err := p.plan(context.Background(), fs, state, &pb.ReceiveHeader{Generation: 1}, tt.raw, fs+"@zn-3", nil, hclog.NewNullLogger())
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
	local := []zfscmd.Snap{{Name: fs + "@zn-1", GUID: 1}, {Name: fs + "@zn-2", GUID: 2}, {Name: fs + "@zn-3", GUID: 3}}
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
			p := NewPusher(&tokenStreams{snaps: local}, "tank/nomad", "n1", 2, nil, nil, hclog.NewNullLogger())
			state := &pb.ReplicaStateResponse{Exists: true, Role: RoleReplica, Generation: tt.generation, SnapshotGuids: tt.remote}
			h := &pb.ReceiveHeader{Generation: 3, HistoryFrom: tt.historyFrom}
			plan, err := p.plan(context.Background(), fs, state, h, false, fs+"@zn-3", nil, hclog.NewNullLogger())
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
