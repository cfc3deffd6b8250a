package cluster

import (
	"strings"
	"testing"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
)

// TestAllAnswered: "no node holds it" is known only when every node the
// controller lists or a node's lease counts answered, and no answering
// node has just started (it keeps a lease and counts no node yet, so it
// cannot say the controller's list lacks one).
func TestAllAnswered(t *testing.T) {
	node := func(id string, known int, held bool) Node {
		return Node{Info: agentclient.NodeInfo{NodeID: id, KnownNodes: known, LeaseHeld: held}}
	}
	tests := []struct {
		name     string
		answered []Node
		silent   int
		all      bool
		unlisted string // a word the reason names, "" for none
	}{
		{"every node counted and answered", []Node{node("n2", 3, true), node("n3", 3, true), node("n1", 3, true)}, 0, true, ""},
		{"nodes without a lease", []Node{node("n1", 0, true), node("n2", 0, true)}, 0, true, ""},
		{"a silent node the list names", []Node{node("n2", 3, true), node("n3", 3, true)}, 1, false, ""},
		{"a node only the leases count", []Node{node("n2", 3, true), node("n3", 3, false)}, 0, false, "1 more"},
		{"both just started, the list shrunk", []Node{node("n2", 0, false), node("n3", 0, false)}, 0, false, "n2, n3"},
		{"one just started beside one that counts", []Node{node("n2", 0, false), node("n3", 2, true)}, 0, false, "n2"},
		{"none answered", nil, 0, false, "names none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AllAnswered(tt.answered, tt.silent); got != tt.all {
				t.Errorf("AllAnswered = %v, want %v", got, tt.all)
			}
			got := Unlisted(tt.answered, tt.silent)
			if (got == "") != (tt.unlisted == "") || !strings.Contains(got, tt.unlisted) {
				t.Errorf("Unlisted = %q, want one naming %q", got, tt.unlisted)
			}
		})
	}
}
