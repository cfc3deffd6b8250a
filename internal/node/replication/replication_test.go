package replication

import (
	"context"
	"maps"
	"slices"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// holdsOnly is the part of Pool that hold bookkeeping uses, in memory.
type holdsOnly struct {
	Pool
	snaps []string            // oldest first
	holds map[string][]string // snapshot -> tags
}

func (h *holdsOnly) Snapshots(context.Context, string) ([]zfs.Snap, error) {
	var out []zfs.Snap
	for i, s := range h.snaps {
		out = append(out, zfs.Snap{Name: s, CreateTXG: uint64(i + 1)})
	}
	return out, nil
}

func (h *holdsOnly) Holds(context.Context, string) (map[string][]string, error) {
	out := map[string][]string{}
	for s, tags := range h.holds {
		if len(tags) > 0 {
			out[s] = slices.Clone(tags)
		}
	}
	return out, nil
}

func (h *holdsOnly) Release(_ context.Context, snapshot, tag string) error {
	h.holds[snapshot] = slices.DeleteFunc(h.holds[snapshot], func(t string) bool { return t == tag })
	return nil
}

func TestReleaseSuperseded(t *testing.T) {
	peerA, peerB := BaseHoldTag+"-a", BaseHoldTag+"-b"
	tests := []struct {
		name  string
		holds map[string][]string
		want  map[string][]string
	}{
		{
			name:  "each tag stays only on its newest snapshot",
			holds: map[string][]string{"fs@1": {peerA, peerB}, "fs@2": {peerA}, "fs@3": {peerA}},
			want:  map[string][]string{"fs@1": {peerB}, "fs@2": {}, "fs@3": {peerA}},
		},
		{
			name:  "a receiver's base moves to the newest received snapshot",
			holds: map[string][]string{"fs@1": {BaseHoldTag}, "fs@3": {BaseHoldTag}},
			want:  map[string][]string{"fs@1": {}, "fs@3": {BaseHoldTag}},
		},
		{
			name:  "holds that are not bases are left alone",
			holds: map[string][]string{"fs@1": {"operator", peerA}, "fs@2": {peerA, "operator"}},
			want:  map[string][]string{"fs@1": {"operator"}, "fs@2": {peerA, "operator"}},
		},
		{
			name:  "a single base is kept",
			holds: map[string][]string{"fs@2": {peerA}},
			want:  map[string][]string{"fs@2": {peerA}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z := &holdsOnly{snaps: []string{"fs@1", "fs@2", "fs@3"}, holds: maps.Clone(tt.holds)}
			if err := releaseSuperseded(context.Background(), z, "fs"); err != nil {
				t.Fatal(err)
			}
			for snap, want := range tt.want {
				if got := z.holds[snap]; !slices.Equal(got, want) && len(got)+len(want) > 0 {
					t.Errorf("%s holds %q, want %q", snap, got, want)
				}
			}
		})
	}
}
