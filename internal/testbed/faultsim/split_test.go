package faultsim

import (
	"slices"
	"testing"
)

// TestAHiddenNodeLeavesTheControllersListUnderEveryAddress: a split that
// drops its cut side from the controller's peer list (as service
// discovery would) drops each of those nodes under every address the
// list names it by, its alias included, and a heal lists them again.
func TestAHiddenNodeLeavesTheControllersListUnderEveryAddress(t *testing.T) {
	net := newNetwork(newDice(1), rates{}, func(string, ...any) {}, func() int64 { return 0 })
	for _, n := range []string{"n1", "n2", "n3"} {
		net.listen(n)
	}
	net.alias("n2b", "n2")
	addr := func(endpoint string) string { return "passthrough:///" + addrOf(endpoint) }
	l := &listedPeers{all: []string{addr("n1"), addr("n2"), addr("n3"), addr("n2b")}, nodeAt: net.nodeAt, hidden: map[string]bool{}}

	for _, tc := range []struct {
		name string
		act  func()
		want []string
	}{
		{"all listed", func() {}, []string{addr("n1"), addr("n2"), addr("n3"), addr("n2b")}},
		{"n2 and n3 hidden", func() { l.hide([]string{"n2", "n3"}) }, []string{addr("n1")}},
		{"healed", l.showAll, []string{addr("n1"), addr("n2"), addr("n3"), addr("n2b")}},
	} {
		tc.act()
		got, err := l.Peers()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: the controller's peers are %v, want %v", tc.name, got, tc.want)
		}
	}
}
