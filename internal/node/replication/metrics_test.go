package replication

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

func TestTransferMetrics(t *testing.T) {
	tests := []struct {
		name          string
		forTarget     bool
		direction     string
		kind, peer    string
		bytes         int64
		took          time.Duration
		err           error
		want, notWant []string
	}{
		{
			name: "a full stream to a peer", direction: "out", kind: KindFull, peer: "n2", bytes: 64 << 20, took: 2 * time.Second,
			want: []string{
				`zfs_nomad_replication_transfer_seconds_count{direction="out",kind="full",result="success"} 1`,
				`zfs_nomad_replication_transfer_bytes_sum{direction="out",kind="full"} 6.7108864e+07`,
				`zfs_nomad_replication_transfer_rate_bytes_per_second_sum{direction="out",kind="full"} 3.3554432e+07`,
				`zfs_nomad_replication_sent_bytes_total{peer_node="n2"} 6.7108864e+07`,
				`zfs_nomad_replication_last_success_timestamp_seconds{direction="out",peer_node="n2"}`,
			},
		},
		{
			name: "an increment to a backup target counts as a backup", direction: "out", kind: KindIncremental, peer: backupKey("t1"), bytes: 1 << 20, took: 100 * time.Millisecond,
			want: []string{
				`zfs_nomad_replication_transfer_seconds_count{direction="out",kind="backup",result="success"} 1`,
				`zfs_nomad_replication_transfer_bytes_count{direction="out",kind="backup"} 1`,
			},
			notWant: []string{`kind="incremental"`, `zfs_nomad_replication_transfer_rate_bytes_per_second_count`},
		},
		{
			name: "a target's receipt is a backup", forTarget: true, direction: "in", kind: KindFull, peer: "n1", bytes: 10, took: time.Second,
			want:    []string{`zfs_nomad_replication_transfer_seconds_count{direction="in",kind="backup",result="success"} 1`, `zfs_nomad_replication_received_bytes_total{source_node="n1"} 10`},
			notWant: []string{`kind="full"`},
		},
		{
			name: "a failure is timed but neither sized nor dated", direction: "in", kind: KindResume, peer: "n3", bytes: 5, took: 3 * time.Second, err: errors.New("broke"),
			want:    []string{`zfs_nomad_replication_transfer_seconds_count{direction="in",kind="resume",result="failure"} 1`, `zfs_nomad_replication_received_bytes_total{source_node="n3"} 5`},
			notWant: []string{`zfs_nomad_replication_transfer_bytes_count`, `zfs_nomad_replication_last_success_timestamp_seconds{`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := metrics.NewRegistry()
			m := NewMetrics(r)
			if tt.forTarget {
				m = ForTarget(m)
			}
			m.transfer(tt.direction, tt.kind, tt.peer, tt.bytes, tt.took, tt.err)
			var out strings.Builder
			if _, err := r.WriteTo(&out); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("metrics lack %s:\n%s", w, grepZFS(out.String()))
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("metrics hold %s:\n%s", w, grepZFS(out.String()))
				}
			}
		})
	}
}

func TestNilMetricsRecordNothing(t *testing.T) {
	var m *Metrics
	m.transfer("out", KindFull, "n2", 1, time.Second, nil) // must not panic
	if ForTarget(m) != nil {
		t.Error("ForTarget(nil) is not nil")
	}
}

// grepZFS keeps the driver's own series of an exposition.
func grepZFS(s string) string {
	var keep []string
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, "zfs_nomad_") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}
