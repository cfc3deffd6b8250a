package main

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/metrics"
)

func TestLeaseMetrics(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_500)
	tests := []struct {
		name          string
		beats         []bool
		want, notWant []string
	}{
		{name: "never held", beats: []bool{false, false},
			want: []string{"\nzfs_nomad_lease_held 0\n"}, notWant: []string{"zfs_nomad_lease_held_timestamp_seconds "}},
		{name: "held", beats: []bool{false, true},
			want: []string{"\nzfs_nomad_lease_held 1\n", "\nzfs_nomad_lease_held_timestamp_seconds 1.7000000005e+09\n"}},
		{name: "lost after holding it keeps when it last held it", beats: []bool{true, false},
			want: []string{"\nzfs_nomad_lease_held 0\n", "\nzfs_nomad_lease_held_timestamp_seconds 1.7000000005e+09\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := metrics.NewRegistry()
			var held atomic.Bool
			beat := leaseMetrics(r, &held, func() time.Time { return at })
			for _, b := range tt.beats {
				beat(b)
			}
			if last := tt.beats[len(tt.beats)-1]; held.Load() != last {
				t.Errorf("held = %v after a beat that said %v", held.Load(), last)
			}
			var out strings.Builder
			if _, err := r.WriteTo(&out); err != nil {
				t.Fatal(err)
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("metrics lack %q:\n%s", w, out.String())
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("metrics hold %q", w)
				}
			}
		})
	}
}
