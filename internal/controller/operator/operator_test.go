package operator

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster/clustertest"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
)

func TestFormatProgress(t *testing.T) {
	tests := []struct {
		p       agentclient.Progress
		elapsed time.Duration
		want    string
	}{
		{agentclient.Progress{Kind: "full", Bytes: 50 << 20, TotalBytes: 200 << 20}, 5 * time.Second,
			"full         50.0 MiB of 200.0 MiB ( 25%)  10.0 MiB/s  ETA 15s"},
		{agentclient.Progress{Kind: "incremental", Bytes: 1 << 20}, time.Second, "incremental   1.0 MiB  1.0 MiB/s"},
		{agentclient.Progress{Kind: "resume", Bytes: 300, TotalBytes: 300, Done: true}, time.Second, "resume          300 B of 300 B (100%)"},
		{agentclient.Progress{Kind: "full"}, 0, "full              0 B"},
	}
	for _, tc := range tests {
		if got := FormatProgress(tc.p, tc.elapsed); got != tc.want {
			t.Errorf("FormatProgress(%v) =\n%q, want\n%q", tc.p, got, tc.want)
		}
	}
}

func TestMarkConflicts(t *testing.T) {
	copies := []CopyStatus{
		{VolumeID: "a", Node: "n1", Role: "primary", Generation: 3},
		{VolumeID: "a", Node: "n2", Role: "primary", Generation: 3},
		{VolumeID: "a", Node: "n3", Role: "replica"},
		{VolumeID: "b", Node: "n1", Role: "primary", Generation: 1},
		{VolumeID: "b", Node: "n2", Role: "primary", Generation: 2},
	}
	markConflicts(copies)
	for i, conflicted := range []bool{true, true, false, false, false} {
		role := describeRole(copies[i])
		if got := strings.Contains(role, "CONFLICT"); got != conflicted || copies[i].Conflict != conflicted {
			t.Errorf("%s on %s: %q, conflict marked %v, want %v", copies[i].VolumeID, copies[i].Node, role, got, conflicted)
		}
	}
}

func TestPrintStatus(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := Report{
		Copies: []CopyStatus{
			{VolumeID: "vol-a", Name: "orders", Node: "n1", Role: "primary", Generation: 2, MovingTo: "n2"},
			{VolumeID: "vol-a", Name: "orders", Node: "n3", Role: "replica", LastSnapshot: "zn-1", LastSnapshotTime: now.Add(-90 * time.Second), Resumable: true},
			{VolumeID: "vol-b", Name: "logs", Node: "n2", Role: "replica"},
		},
		Transfers: []TransferStatus{{VolumeID: "vol-a", From: "n1", To: "n3", Kind: "incremental", Bytes: 1 << 20, Started: now.Add(-time.Second),
			Purpose: "catch-up for the move to n3"}},
		SetAside: []SetAsideCopy{{Node: "n2", Dataset: "tank/nomad/vol-c-aside-1"}},
		Moves: []migration.MoveStatus{
			{VolumeID: "vol-a", From: "n1", To: "n3", Started: now.Add(-time.Second), Bytes: 1 << 20},
			{VolumeID: "vol-d", From: "n2", To: "n1", Started: now.Add(-time.Minute), CaughtUp: now.Add(-12 * time.Second)},
			{VolumeID: "vol-e", From: "n2", To: "n3", Started: now.Add(-5 * time.Second), FinalStep: true, PublishedAhead: now.Add(-4 * time.Second)},
			{VolumeID: "vol-f", From: "n1", To: "n2", Started: now.Add(-time.Minute), FinalStep: true, Moved: now.Add(-3 * time.Second)},
		},
		Unreachable: []Unreachable{{Node: "10.0.0.4:7670", Error: "connection refused"}},
	}
	var out strings.Builder
	PrintStatus(&out, r, now)
	for _, want := range []string{
		"primary g2, moving to n2",
		"1m30s (interrupted, resumable)",
		"never completed",
		"transfers running: 1\n  vol-a: n1 -> n3  incremental   1.0 MiB  1.0 MiB/s  (catch-up for the move to n3)",
		"tank/nomad/vol-c-aside-1 on n2",
		"moves in progress: 4\n  vol-a: n1 -> n3  catching up: ",
		"  vol-d: n2 -> n1  caught up 12s ago; final step pending: the next publish retry runs it",
		"  vol-e: n2 -> n3  final step running (fence, last increment, promotion), 5s after the start; published ahead of its end 4s ago: the node's stage waits for it",
		"  vol-f: n1 -> n2  moved 3s ago; the publish's retry finds it there",
		"unreachable: 10.0.0.4:7670: connection refused",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}

// TestAddMoves: status asks the running controller for its moves at its
// metrics address; one it cannot reach is reported, not fatal.
func TestAddMoves(t *testing.T) {
	var fakes clustertest.Fakes
	fakes.Add(agentclient.NodeInfo{NodeID: "n1"})
	m := migration.New(fakes.Cluster(t), hclog.NewNullLogger())
	srv := httptest.NewServer(m.MovesHandler())
	defer srv.Close()
	ctx := context.Background()

	var r Report
	AddMoves(ctx, &r, strings.TrimPrefix(srv.URL, "http://"))
	if r.Moves == nil || len(r.Moves) != 0 || len(r.Unreachable) != 0 {
		t.Errorf("a controller with no moves: moves %v, unreachable %v; want an empty list", r.Moves, r.Unreachable)
	}
	srv.Close()
	r = Report{}
	AddMoves(ctx, &r, strings.TrimPrefix(srv.URL, "http://"))
	if len(r.Unreachable) != 1 || !strings.Contains(r.Unreachable[0].Error, "moves in progress unknown") {
		t.Errorf("a controller that does not answer: unreachable %v, want it named", r.Unreachable)
	}
	r = Report{}
	AddMoves(ctx, &r, "")
	if r.Moves != nil || len(r.Unreachable) != 0 {
		t.Errorf("no address: %+v, want nothing added", r)
	}
}
