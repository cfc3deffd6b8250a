package operator

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
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
		Moves: []Move{
			{MoveStatus: migration.MoveStatus{VolumeID: "vol-a", From: "n1", To: "n3", Started: now.Add(-time.Second), Bytes: 1 << 20}},
			{MoveStatus: migration.MoveStatus{VolumeID: "vol-d", From: "n2", To: "n1", Started: now.Add(-time.Minute), CaughtUp: now.Add(-12 * time.Second)}},
			{MoveStatus: migration.MoveStatus{VolumeID: "vol-e", From: "n2", To: "n3", Started: now.Add(-5 * time.Second), FinalStep: true, PublishedAhead: now.Add(-4 * time.Second)}},
			{MoveStatus: migration.MoveStatus{VolumeID: "vol-f", From: "n1", To: "n2", Started: now.Add(-time.Minute), FinalStep: true, Moved: now.Add(-3 * time.Second)}},
			{MoveStatus: migration.MoveStatus{VolumeID: "vol-g", From: "n3", To: "n1", Started: now.Add(-time.Minute), FinalStep: true, NothingToMove: now.Add(-2 * time.Second)}},
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
		"moves in progress: 5\n  vol-a: n1 -> n3  catching up: ",
		"  vol-d: n2 -> n1  caught up 12s ago; final step pending: the next publish retry runs it",
		"  vol-e: n2 -> n3  final step running (fence, last increment, promotion), 5s after the start; published ahead of its end 4s ago: the node's stage waits for it",
		"  vol-f: n1 -> n2  moved 3s ago; the publish's retry finds it there",
		"  vol-g: n3 -> n1  not moved: 2s ago its final step found it published again on its node, or no longer its primary there; the publish's retry decides afresh",
		"unreachable: 10.0.0.4:7670: connection refused",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}

// TestAddMoves: status asks the controller instances for their moves at
// their metrics addresses: the one named, else every instance the nodes
// know, else the configuration's; one it cannot reach is reported, not
// fatal.
func TestAddMoves(t *testing.T) {
	serve := func(moves ...migration.MoveStatus) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_ = json.NewEncoder(w).Encode(append([]migration.MoveStatus{}, moves...))
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	idle := serve()
	a := serve(migration.MoveStatus{VolumeID: "vol-b", From: "n1", To: "n2"})
	b := serve(migration.MoveStatus{VolumeID: "vol-a", From: "n2", To: "n3"})
	down := httptest.NewServer(http.NotFoundHandler())
	gone := strings.TrimPrefix(down.URL, "http://")
	down.Close()
	tests := []struct {
		name            string
		controllers     []ControllerStatus
		addr, fallback  string
		wantMoves       string // volume@controller, in order
		wantUnreachable string
	}{
		{"the instance named", []ControllerStatus{{ID: "ctl-1", Address: a}}, idle, a, "", ""},
		{"every instance the nodes know", []ControllerStatus{{ID: "ctl-1", Address: a}, {ID: "ctl-2", Address: b}}, "", idle, "vol-a@ctl-2 vol-b@ctl-1", ""},
		{"one instance does not answer", []ControllerStatus{{ID: "ctl-1", Address: a}, {ID: "ctl-2", Address: gone}}, "", "", "vol-b@ctl-1", "controller ctl-2"},
		{"no instance known: the configuration's", nil, "", b, "vol-a@" + b, ""},
		{"no address at all", nil, "", "", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Report{Controllers: tc.controllers}
			AddMoves(context.Background(), &r, tc.addr, tc.fallback)
			var got []string
			for _, m := range r.Moves {
				got = append(got, m.VolumeID+"@"+m.Controller)
			}
			var unreachable []string
			for _, u := range r.Unreachable {
				unreachable = append(unreachable, u.Node)
			}
			if strings.Join(got, " ") != tc.wantMoves || strings.Join(unreachable, " ") != tc.wantUnreachable {
				t.Errorf("moves %v, unreachable %v; want %q, %q", got, unreachable, tc.wantMoves, tc.wantUnreachable)
			}
		})
	}
}
