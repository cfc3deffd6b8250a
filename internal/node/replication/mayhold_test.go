package replication

import (
	"fmt"
	"slices"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs"
)

func noHolds() (map[string][]string, error) { return nil, nil }

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
			p.learnReceiver("v", "n3", func() ([]zfs.Snap, error) { return local, nil }, noHolds, held)
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

// TestAnEarlierProcesssStreamsAreSpared: a process knows nothing of what
// its predecessor streamed, so the first push of a volume in a process
// spares, for every receiver with a tag here (its base's, or the
// streamed tag of its first stream, streamed.go), the replication
// snapshots after it, until a push reads what that receiver holds. The
// listing's order says which are after the base, not the time in their
// names.
func TestAnEarlierProcesssStreamsAreSpared(t *testing.T) {
	snap := func(at int) zfs.Snap {
		return zfs.Snap{Name: fmt.Sprintf("tank/v@zn-%d", at), GUID: uint64(at)}
	}
	// Oldest first: n2's base is zn-100, n3's zn-300; zn-50 was taken
	// after zn-300 by a clock that stepped back.
	local := []zfs.Snap{snap(100), snap(200), snap(300), snap(400), snap(50)}
	holds := func() (map[string][]string, error) {
		return map[string][]string{local[0].Name: {peerTag("n2")}, local[2].Name: {peerTag("n3")}}, nil
	}
	listed := func() ([]zfs.Snap, error) { return local, nil }
	p := &Pusher{}
	sorted := func() []string { got := p.mayHold("v"); slices.Sort(got); return got }
	// A push to n2, which holds zn-100 alone: n3 is not read yet.
	p.learnReceiver("v", "n2", listed, holds, []uint64{100})
	if got, want := sorted(), []string{local[3].Name, local[4].Name}; !slices.Equal(got, want) {
		t.Errorf("after the first push in the process, %v spared; want %v (n2 read, holding its base alone; n3 not read)", got, want)
	}
	// n3 answers holding zn-400: an earlier process's stream whose
	// answer was lost. It stays spared until a push to n3 succeeds.
	p.learnReceiver("v", "n3", listed, holds, []uint64{300, 400})
	if got := sorted(); !slices.Equal(got, []string{local[3].Name}) {
		t.Errorf("n3 read holding zn-400: %v spared, want zn-400", got)
	}
	p.forgetStreamed("v", "n3")
	// The seeding is once per volume: a later push records nothing again.
	p.learnReceiver("v", "n2", listed, holds, []uint64{100})
	if got := sorted(); len(got) != 0 {
		t.Errorf("after a push to n3 succeeded, %v spared; want none", got)
	}
}

// TestAFirstStreamsMarkIsSpared: a receiver whose only tag here is the
// streamed one (its first push broke) is known to a restarted process:
// what follows the marked snapshot stays spared until it is read.
func TestAFirstStreamsMarkIsSpared(t *testing.T) {
	local := []zfs.Snap{{Name: "tank/v@zn-100", GUID: 100}, {Name: "tank/v@zn-200", GUID: 200}, {Name: "tank/v@zn-300", GUID: 300}}
	holds := func() (map[string][]string, error) {
		return map[string][]string{local[0].Name: {peerTag("n2")}, local[1].Name: {streamedTag("n3")}}, nil
	}
	p := &Pusher{}
	p.learnReceiver("v", "n2", func() ([]zfs.Snap, error) { return local, nil }, holds, []uint64{100})
	if got := p.mayHold("v"); !slices.Equal(got, []string{local[2].Name}) {
		t.Errorf("with n3 marked on zn-200 and not read, %v spared; want zn-300", got)
	}
	if !receiverKnown(holds, "n3") || !receiverKnown(holds, "n2") || receiverKnown(holds, "n4") {
		t.Errorf("receiverKnown: n2 (base tag) and n3 (streamed tag) are known, n4 is not")
	}
}
