package lease

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
)

// The invariant of docs/safety.md, "Why the lease and failover
// majorities intersect", over a witness set: while a node holds its
// lease (a majority of the witnesses answered it within L), no majority
// of the witnesses attests it silent for L+M, whether the node is a
// witness or not.

// witnessCluster is seven nodes, w1 to w3 the witnesses, on a memNet
// whose links the test cuts one way or both, each node beating on the
// test's clock.
type witnessCluster struct {
	t        *testing.T
	clock    *clock
	net      *memNet
	set      witnesses.Set
	nodes    []string
	monitors map[string]*Monitor
	beats    map[string]*Heartbeat
}

func newWitnessCluster(t *testing.T) *witnessCluster {
	set, err := witnesses.Parse([]string{"w1@w1:7670", "w2@w2:7670", "w3@w3:7670"})
	if err != nil {
		t.Fatal(err)
	}
	c := &witnessCluster{t: t, clock: &clock{t: time.Unix(1000, 0)}, net: newMemNet(), set: set,
		nodes: []string{"w1", "w2", "w3", "n4", "n5", "n6", "n7"}, monitors: map[string]*Monitor{}, beats: map[string]*Heartbeat{}}
	for _, id := range c.nodes {
		c.start(id)
	}
	return c
}

func addrOf(id string) string { return id + ":7670" }

// start starts (or restarts, forgetting all it heard) node id.
func (c *witnessCluster) start(id string) {
	m := NewMonitor(testLease, c.clock.now)
	m.RequirePeers()
	m.UseWitnesses(id, c.set)
	c.monitors[id] = m
	c.net.mu.Lock()
	c.net.digests[id] = c.set.Digest()
	c.net.mu.Unlock()
	c.net.serveWith(addrOf(id), &Server{NodeID: id, Domain: "d", Monitor: m, WitnessDigest: c.set.Digest(),
		Promised: func(context.Context, string) (uint64, error) { return 0, nil }})
	everyone := make([]string, 0, len(c.nodes))
	for _, n := range c.nodes {
		everyone = append(everyone, addrOf(n))
	}
	c.beats[id] = &Heartbeat{Monitor: m, NodeID: id, Interval: testLease / 4,
		Peers: func() ([]string, error) { return everyone, nil }, Client: c.net.client(id),
		Volumes: emptyVolumes(), Log: hclog.NewNullLogger()}
}

// cut sets which links fail, from node to node.
func (c *witnessCluster) cut(links map[[2]string]bool) {
	c.net.mu.Lock()
	defer c.net.mu.Unlock()
	c.net.cut = map[[2]string]bool{}
	for l := range links {
		c.net.cut[[2]string{l[0], addrOf(l[1])}] = true
	}
}

// attesting lists the nodes of among that attest x silent for L+M to a
// controller that every node but x answered.
func (c *witnessCluster) attesting(x string, among []string) []string {
	answering := slices.DeleteFunc(slices.Clone(c.nodes), func(n string) bool { return n == x })
	var out []string
	for _, id := range among {
		if id != x && c.monitors[id].AttestFailover(id, []string{addrOf(x)}, answering, testLease+testMargin) == nil {
			out = append(out, id)
		}
	}
	return out
}

// twoWriters returns a node that holds its lease while granted decides
// its failover granted, and the nodes that attest it.
func (c *witnessCluster) twoWriters(granted func(attesting []string) bool) (string, []string) {
	for _, x := range c.nodes {
		if !c.monitors[x].Held(x) {
			continue
		}
		if a := c.attesting(x, c.nodes); granted(a) {
			return x, a
		}
	}
	return "", nil
}

// run plays one random history: links cut and healed at random, nodes
// that miss beats or restart, every node checked after every beat.
// granted is the failover's rule under test; it returns the first
// violation found.
func (c *witnessCluster) run(rng *rand.Rand, rounds int, granted func([]string) bool) error {
	for round := range rounds {
		if rng.IntN(10) == 0 {
			links := map[[2]string]bool{}
			p := rng.Float64() * 0.7
			for _, a := range c.nodes {
				for _, b := range c.nodes {
					if a != b && rng.Float64() < p {
						links[[2]string{a, b}] = true
					}
				}
			}
			c.cut(links)
		}
		if rng.IntN(40) == 0 {
			c.start(c.nodes[rng.IntN(len(c.nodes))])
		}
		for _, id := range c.nodes {
			if rng.IntN(8) == 0 { // a starved process misses its beat
				continue
			}
			c.beats[id].Beat(context.Background())
			if x, a := c.twoWriters(granted); x != "" {
				return fmt.Errorf("round %d, after %s's beat: %s holds its lease while %v attest it silent for L+M: a failover would be granted while it may write", round, id, x, a)
			}
		}
		c.clock.t = c.clock.t.Add(testLease / 4)
	}
	return nil
}

// TestWitnessLeaseAndFailoverIntersect plays random histories of cuts,
// missed beats and restarts over seven nodes with three witnesses: a
// failover that a majority of the witnesses attests never meets a lease.
// Counting the attestations of all seven instead (the rule of a cluster
// without witnesses, whose lease counts all seven) finds a node that
// holds its lease through the witnesses while the four others, which it
// never pings, attest it silent: the test can fail.
func TestWitnessLeaseAndFailoverIntersect(t *testing.T) {
	const seeds, rounds = 40, 120
	var set witnesses.Set
	overWitnesses := func(a []string) bool { return set.Majority(a) }
	overAll := func(a []string) bool { return len(a) > 7/2 }
	found := false
	for seed := range uint64(seeds) {
		c := newWitnessCluster(t)
		set = c.set
		if err := c.run(rand.New(rand.NewPCG(seed, 1)), rounds, overWitnesses); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if !found {
			c := newWitnessCluster(t)
			found = c.run(rand.New(rand.NewPCG(seed, 1)), rounds, overAll) != nil
		}
	}
	if !found {
		t.Error("counting every node's attestation found no two writers in any seed: the histories are too tame to test the witnesses' rule")
	}
}

// TestWitnessLeaseCountsOnlyWitnesses: a node holds its lease through a
// majority of the witnesses, and through nothing else; a node that is
// not a witness does not count itself.
func TestWitnessLeaseCountsOnlyWitnesses(t *testing.T) {
	tests := []struct {
		name     string
		node     string
		reaches  []string // the witnesses its pings reach
		wantHeld bool
	}{
		{"a node that is not one, two of three witnesses", "n4", []string{"w1", "w2"}, true},
		{"a node that is not one, one witness", "n4", []string{"w1"}, false},
		{"a witness and one other", "w1", []string{"w2"}, true},
		{"a witness alone", "w1", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newWitnessCluster(t)
			links := map[[2]string]bool{}
			for _, w := range c.set.IDs() {
				if !slices.Contains(tt.reaches, w) {
					links[[2]string{tt.node, w}] = true
				}
			}
			c.cut(links)
			c.beats[tt.node].Beat(context.Background())
			if got := c.monitors[tt.node].Held(tt.node); got != tt.wantHeld {
				t.Errorf("%s reaching %v holds its lease: %v, want %v (silent: %v)", tt.node, tt.reaches, got, tt.wantHeld, c.monitors[tt.node].Silent(tt.node))
			}
			want := 4 // itself and the witnesses
			if tt.node[0] == 'w' {
				want = 3
			}
			if got := c.monitors[tt.node].Members(tt.node); got != want {
				t.Errorf("Members = %d, want %d (itself and the witnesses: it heard no other node)", got, want)
			}
		})
	}
}

// TestWitnessAnswersAsItself: an answer at a witness's address from any
// other node counts for nothing.
func TestWitnessAnswersAsItself(t *testing.T) {
	c := newWitnessCluster(t)
	c.net.serveWith(addrOf("w2"), &Server{NodeID: "n5", Domain: "d", WitnessDigest: c.set.Digest(),
		Promised: func(context.Context, string) (uint64, error) { return 0, nil }})
	c.cut(map[[2]string]bool{{"n4", "w3"}: true})
	c.beats["n4"].Beat(context.Background())
	if c.monitors["n4"].Held("n4") {
		t.Errorf("n4 holds its lease through w1 and n5 answering at w2's address")
	}
}

// TestWitnessAttestsByIdentity: a witness attests a failover only once up
// for L+M, and not while a node beyond those that answered the controller
// called it within L+M, whether or not the controller named its address.
func TestWitnessAttestsByIdentity(t *testing.T) {
	c := newWitnessCluster(t)
	need := testLease + testMargin
	w1 := c.monitors["w1"]
	all := []string{"w1", "w2", "w3", "n4", "n5", "n6"} // n7 does not answer
	if err := w1.AttestFailover("w1", []string{addrOf("n7")}, all, need); err == nil {
		t.Error("w1 attests a failover before it has been up for L+M")
	}
	c.clock.t = c.clock.t.Add(need)
	if err := w1.AttestFailover("w1", []string{addrOf("n7")}, all, need); err != nil {
		t.Errorf("w1, up for L+M and never called by n7, refuses: %v", err)
	}
	w1.Called("n6")
	if err := w1.AttestFailover("w1", []string{addrOf("n7")}, all, need); err != nil {
		t.Errorf("a call from n6, which answered the controller, stops w1's attestation: %v", err)
	}
	if err := w1.AttestFailover("w1", []string{addrOf("n7")}, all[:5], need); err == nil {
		t.Error("w1 attests a failover while n6, which did not answer the controller (its address not named), called it just now")
	}
	c.clock.t = c.clock.t.Add(need)
	if err := w1.AttestFailover("w1", nil, all[:5], need); err != nil {
		t.Errorf("n6 silent for L+M, w1 still refuses: %v", err)
	}
}

// TestWitnessCannotBeRetired: retiring a witness would shrink the set
// one node's majorities count over.
func TestWitnessCannotBeRetired(t *testing.T) {
	c := newWitnessCluster(t)
	c.clock.t = c.clock.t.Add(time.Hour)
	if err := c.monitors["w1"].Retire("w1", "w2", testLease+testMargin); err == nil {
		t.Error("w1 retired witness w2")
	}
	if err := c.monitors["w1"].Retire("w1", "n4", testLease+testMargin); err != nil {
		t.Errorf("w1 refused to retire n4, silent for an hour: %v", err)
	}
}

// TestWitnessConfirmationCountsOnlyWitnesses: a node that is not a
// witness confirms a primary current only when a majority of the
// witnesses answered, its own word not among them. n4 holds its lease
// through w1 and w2, but w2 cannot read its promises: w1's answer alone
// confirms nothing.
func TestWitnessConfirmationCountsOnlyWitnesses(t *testing.T) {
	const id = "vol-0123456789abcdef0123"
	for _, w2Answers := range []bool{false, true} {
		t.Run(fmt.Sprintf("w2 answers: %v", w2Answers), func(t *testing.T) {
			c := newWitnessCluster(t)
			if !w2Answers {
				c.net.serveWith(addrOf("w2"), &Server{NodeID: "w2", Domain: "d", Monitor: c.monitors["w2"], WitnessDigest: c.set.Digest(),
					Promised: func(context.Context, string) (uint64, error) { return 0, fmt.Errorf("pool busy") }})
			}
			c.cut(map[[2]string]bool{{"n4", "w3"}: true})
			vols := emptyVolumes()
			vols.primaries[id] = 3
			c.beats["n4"].Volumes = vols
			c.beats["n4"].Beat(context.Background())
			if !c.monitors["n4"].Held("n4") {
				t.Fatal("n4 reaches w1 and w2 but holds no lease")
			}
			if confirmed := vols.confirmed[id] == 3; confirmed != w2Answers {
				t.Errorf("n4's primary confirmed: %v, want %v", confirmed, w2Answers)
			}
		})
	}
}

// TestWitnessesMustAgree: a node whose witness list differs from the
// witnesses' own gets no answer from them, so holds no lease, while it
// still counts for the attestations as a caller: its set is not the one
// the failovers are counted over.
func TestWitnessesMustAgree(t *testing.T) {
	c := newWitnessCluster(t)
	c.net.mu.Lock()
	c.net.digests["n4"] = "another-set"
	c.net.mu.Unlock()
	c.beats["n4"].Beat(context.Background())
	if c.monitors["n4"].Held("n4") {
		t.Error("n4, counting another witness set, holds its lease through the witnesses' answers")
	}
	silent := c.monitors["n4"].Silent("n4")
	if len(silent) != 3 || !strings.Contains(silent[0], "list the same witnesses on every node") {
		t.Errorf("n4's silent witnesses do not say why: %q", silent)
	}
}

// TestWitnessKnowsEveryNodeThatPings: a witness counts every node that
// pinged it in Members, which the controller's "no node holds it"
// counts; a retired node leaves the count.
func TestWitnessKnowsEveryNodeThatPings(t *testing.T) {
	c := newWitnessCluster(t)
	for _, id := range c.nodes {
		c.beats[id].Beat(context.Background())
	}
	if got := c.monitors["w1"].Members("w1"); got != 7 {
		t.Errorf("w1, pinged by all seven nodes, counts %d", got)
	}
	c.clock.t = c.clock.t.Add(time.Hour)
	if err := c.monitors["w1"].Retire("w1", "n7", testLease+testMargin); err != nil {
		t.Fatal(err)
	}
	if got := c.monitors["w1"].Members("w1"); got != 6 {
		t.Errorf("w1 retired n7 and counts %d, want 6", got)
	}
}
