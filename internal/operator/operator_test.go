package operator

import (
	"strings"
	"testing"
	"time"

	pb "github.com/zfs-nomad/zfs-nomad/proto/agentpb"
)

func TestFormatProgress(t *testing.T) {
	tests := []struct {
		p       *pb.ReplicateProgress
		elapsed time.Duration
		want    string
	}{
		{&pb.ReplicateProgress{Kind: "full", Bytes: 50 << 20, TotalBytes: 200 << 20}, 5 * time.Second,
			"full         50.0 MiB of 200.0 MiB ( 25%)  10.0 MiB/s  ETA 15s"},
		{&pb.ReplicateProgress{Kind: "incremental", Bytes: 1 << 20}, time.Second, "incremental   1.0 MiB  1.0 MiB/s"},
		{&pb.ReplicateProgress{Kind: "resume", Bytes: 300, TotalBytes: 300, Done: true}, time.Second, "resume          300 B of 300 B (100%)"},
		{&pb.ReplicateProgress{Kind: "full"}, 0, "full              0 B"},
	}
	for _, tc := range tests {
		if got := FormatProgress(tc.p, tc.elapsed); got != tc.want {
			t.Errorf("FormatProgress(%v) =\n%q, want\n%q", tc.p, got, tc.want)
		}
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 3 << 30: "3.0 GiB", 5 << 40: "5.0 TiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestMarkConflicts(t *testing.T) {
	rows := []row{
		{volume: "a", node: "n1", role: "primary g3", generation: 3},
		{volume: "a", node: "n2", role: "primary g3", generation: 3},
		{volume: "a", node: "n3", role: "replica"},
		{volume: "b", node: "n1", role: "primary g1", generation: 1},
		{volume: "b", node: "n2", role: "primary g2", generation: 2},
	}
	markConflicts(rows)
	for i, conflicted := range []bool{true, true, false, false, false} {
		if got := strings.Contains(rows[i].role, "CONFLICT"); got != conflicted {
			t.Errorf("%s on %s: %q, conflict marked %v, want %v", rows[i].volume, rows[i].node, rows[i].role, got, conflicted)
		}
	}
}
