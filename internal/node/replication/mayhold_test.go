package replication

import (
	"fmt"
	"slices"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

// TestWhatAReceiverMayHoldIsSpared: the snapshots whose streams to a
// receiver started since its last successful push stay spared until a
// push reads what it holds; then only its newest and the newer ones
// stay, at most maxStreamed of those.
func TestWhatAReceiverMayHoldIsSpared(t *testing.T) {
	many := make([]string, maxStreamed+2)
	for i := range many {
		many[i] = fmt.Sprintf("m%02d", i)
	}
	tests := []struct {
		name   string
		local  []string // this node's snapshots, oldest first
		noted  []string // streamed to the receiver
		held   []string // the receiver's, oldest first
		spared []string
	}{
		{"the receiver holds one of them", []string{"x", "a", "b", "c"}, []string{"a", "b", "c"}, []string{"x", "a", "b"}, []string{"b", "c"}},
		{"the receiver holds the newest", []string{"x", "a", "b", "c"}, []string{"a", "b", "c"}, []string{"x", "c"}, []string{"c"}},
		{"the receiver holds none of them", []string{"x", "a", "b"}, []string{"a", "b"}, []string{"x"}, []string{"a", "b"}},
		{"the receiver's newest is not here", []string{"a", "b"}, []string{"a", "b"}, []string{"y"}, []string{"a", "b"}},
		{"the receiver holds nothing", []string{"a", "b"}, []string{"a", "b"}, nil, []string{"a", "b"}},
		{"one is gone here", []string{"x", "b"}, []string{"a", "b"}, []string{"x"}, []string{"b"}},
		{"the receiver is past them all", []string{"a", "b", "z"}, []string{"a", "b"}, []string{"z"}, nil},
		{"more than the bound failed", append([]string{"x"}, many...), many, []string{"x"}, many[2:]},
		{"more than the bound failed after the receiver's newest", many, many, []string{many[0]}, append([]string{many[0]}, many[2:]...)},
	}
	guid := func(name string) uint64 { return uint64(name[0])<<8 | uint64(name[len(name)-1]) }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var local []zfs.Snap
			for _, n := range tt.local {
				local = append(local, zfs.Snap{Name: n, GUID: guid(n)})
			}
			var held []uint64
			for _, n := range tt.held {
				held = append(held, guid(n))
			}
			p := &Pusher{}
			for _, n := range tt.noted {
				p.noteStreaming("v", "n3", n)
			}
			p.noteStreaming("v", "n2", "other")
			p.trimStreamed("v", "n3", func() ([]zfs.Snap, error) { return local, nil }, held)
			got := slices.DeleteFunc(p.mayHold("v"), func(s string) bool { return s == "other" })
			if !slices.Equal(got, tt.spared) && len(got)+len(tt.spared) > 0 {
				t.Errorf("spared %v, want %v", got, tt.spared)
			}
			if !slices.Contains(p.mayHold("v"), "other") {
				t.Errorf("another receiver's snapshot is no longer spared")
			}
			p.forgetStreamed("v", "n3")
			if got := p.mayHold("v"); !slices.Equal(got, []string{"other"}) {
				t.Errorf("after a push to the receiver succeeded, %v spared; want another receiver's alone", got)
			}
		})
	}
}
