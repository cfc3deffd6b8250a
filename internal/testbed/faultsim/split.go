package faultsim

import (
	"slices"
	"strings"
	"sync"
	"time"
)

// listedPeers is the controller's peer list as service discovery renders
// it: every node, less those a split hid from it (a node whose Nomad
// client the servers lost is dropped from the agents' service). A heal
// lists them all again.
type listedPeers struct {
	mu  sync.Mutex
	all []string
	// nodeAt names the node an endpoint reaches: its own name, or the
	// node an alias stands for (network.nodeAt).
	nodeAt func(endpoint string) string
	hidden map[string]bool // by node: every address of a hidden node goes
}

func (l *listedPeers) Peers() ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, a := range l.all {
		if !l.hidden[l.nodeAt(endpointOf(a))] {
			out = append(out, a)
		}
	}
	return out, nil
}

// hide drops every address of the nodes from the list.
func (l *listedPeers) hide(nodes []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range nodes {
		l.hidden[n] = true
	}
}

func (l *listedPeers) showAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hidden = map[string]bool{}
}

// split partitions the nodes in two for 5 to 34 steps (heals in between
// heal only the other cuts): a side of at most half of them,
// around the node that runs v's job if any, is cut off from the rest and
// the controller. Three shapes, each a way the lease and the failover's
// majority could miss each other (a lease counted by domain, a node heard
// only by its own calls, the controller's shrinking peer list):
//
//   - in a run with domains, half the splits take a majority of one
//     domain, still a minority of all nodes (a lease counted by domain
//     holds on that side while the other side fails over);
//   - two splits in five are one-way: the other side cannot connect to
//     the cut side, whose own connections still work both ways (a node
//     that dials out keeps its lease; its peers hear it only by its
//     calls); three in four of those also cut the cut side off from the
//     controller and the CO both ways, so that the CO places its jobs
//     elsewhere (with a replica there, the failover that a peer's calls
//     must stop);
//   - half the two-way splits also drop the cut side from the
//     controller's peer list, as service discovery would.
func (w *world) split(v *simVolume) {
	side := w.cutSide(v)
	var rest []string
	for _, n := range w.nodes {
		if !slices.Contains(side, n.id) {
			rest = append(rest, n.id)
		}
	}
	rest = append(rest, controllerEndpoint)
	// Other controller instances end up on either side: one cut off with
	// a minority of the nodes must not keep the work lease while one
	// with the majority takes it.
	ends := side
	for _, c := range w.ctls[1:] {
		if w.dice.chance(0.5) {
			ends = append(slices.Clone(ends), c.endpoint)
		} else {
			rest = append(rest, c.endpoint)
		}
	}
	oneWay := w.dice.chance(0.4)
	hide := !oneWay && w.dice.chance(0.5)
	// A one-way split leaves the cut side's own connections working; most
	// also cut it off from the CO both ways (its Nomad client
	// lost the servers, which reschedule its jobs) while its agent still
	// reaches its peers.
	lostToCO := oneWay && w.dice.chance(0.75)
	lasts := 5 + w.dice.intn(30)
	w.splitEnds = w.step + lasts
	// A node's wall clock steps about when the cut side's lease runs out
	// (L) and when its peers may attest its silence (L+M): the lease and
	// the failover must not read it (docs/simulation.md, "Clocks").
	w.clockSteps = []int{w.step + int(w.cfg.Lease/time.Second) + w.dice.intn(3) - 1,
		w.step + int((w.cfg.Lease+w.cfg.LeaseMargin)/time.Second) + w.dice.intn(3) - 1}
	w.splitAgain = func() {
		for _, a := range ends {
			for _, b := range rest {
				if oneWay && !(lostToCO && b == controllerEndpoint) {
					w.net.blockDial(b, a)
					continue
				}
				w.net.partition(a, b, true)
				w.net.partition(b, a, true)
			}
		}
		if hide {
			w.peers.hide(side)
		}
	}
	w.splitAgain()
	if w.cfg.LyingPeers {
		w.stallOnTheCutSide(side)
	}
	how := "both ways"
	if oneWay {
		how = "one way: the rest cannot connect to " + strings.Join(side, ",")
	}
	if lostToCO {
		how += "; the controller and the CO lost " + strings.Join(side, ",") + " both ways"
	}
	if hide {
		how += "; the controller's peer list drops " + strings.Join(side, ",")
	}
	w.tracef("net: split %s | %s for %d steps (%s)", strings.Join(ends, ","), strings.Join(rest, ","), lasts, how)
}

// cutSide picks the cut side of a split: the node of a running job (v's
// if v has one; any node if none runs), and in a run
// with domains, half the time, enough others of its domain to make a
// majority of the domain if that is still a minority of all nodes;
// otherwise up to a minority of all nodes, at random.
func (w *world) cutSide(v *simVolume) []string {
	first := w.nodes[w.dice.intn(len(w.nodes))]
	var running []string
	for _, u := range w.vols {
		if u.alloc != "" {
			running = append(running, u.alloc)
		}
	}
	if v.alloc != "" {
		first = w.node(v.alloc)
	} else if len(running) > 0 {
		first = w.node(running[w.dice.intn(len(running))])
	}
	side, most := []string{first.id}, (len(w.nodes)-1)/2
	var pool []*simNode // the nodes the side may grow by
	want := 1 + w.dice.intn(max(most, 1))
	if len(w.cfg.Witnesses) > 0 && w.dice.chance(0.5) {
		// A majority of the witnesses, the job's node among them, that is
		// a minority of all nodes: the leases on that side hold, and a
		// failover counted over all nodes would be granted on the other.
		var ws []*simNode
		for _, id := range w.cfg.Witnesses {
			if id != first.id {
				ws = append(ws, w.node(id))
			}
		}
		need := len(w.cfg.Witnesses)/2 + 1
		if slices.Contains(w.cfg.Witnesses, first.id) {
			need--
		}
		if 1+need <= most {
			pool, want = ws, 1+need
		}
	} else if w.cfg.Domains > 1 && w.dice.chance(0.5) {
		var domain []*simNode
		for _, n := range w.nodes {
			if n.domain == first.domain {
				domain = append(domain, n)
			}
		}
		if majority := len(domain)/2 + 1; majority <= most {
			pool, want = domain, majority
		}
	}
	if pool == nil {
		pool = w.nodes
	}
	for len(side) < min(want, most) {
		n := pool[w.dice.intn(len(pool))]
		if !slices.Contains(side, n.id) {
			side = append(side, n.id)
		}
	}
	return side
}

// stepWallClock steps one node's wall clock to another offset within
// the run's skew, forwards or back: a snapshot it names now may sort
// before one it named earlier, and a fence it dates may seem to come
// before the events it follows. Nothing that decides may depend on it.
func (w *world) stepWallClock() {
	if w.cfg.Skew <= 0 {
		return
	}
	n := w.nodes[w.dice.intn(len(w.nodes))]
	to := time.Duration((2*w.dice.float() - 1) * float64(w.cfg.Skew)).Truncate(time.Second)
	from := time.Duration(n.skew.Swap(int64(to)))
	w.tracef("clock: the wall clock of %s steps by %s (its offset from %s to %s)", n.id, to-from, from, to)
}

// stallOnTheCutSide, in a run with lying peers, has a liar on the cut
// side of every split stall a stream into the primary of the job that
// runs at the side's first node, for the split's whole time, after the
// header alone (a receiver that took the copy's lock at the header
// would hold it until the first record): the node must fence
// that primary when its lease runs out, whatever the liar holds.
func (w *world) stallOnTheCutSide(side []string) {
	victim := w.node(side[0])
	var v *simVolume
	for _, u := range w.vols {
		if u.alloc == victim.id && u.created {
			v = u
		}
	}
	if v == nil || victim.inc == nil {
		return
	}
	var others []*simNode
	for _, n := range w.nodes {
		if n != victim {
			others = append(others, n)
		}
	}
	w.stallUntil(v, others[w.dice.intn(len(others))], victim, w.splitEnds, false)
}
