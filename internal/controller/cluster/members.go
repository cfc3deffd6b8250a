package cluster

import (
	"fmt"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
)

// Members is how many nodes a majority is taken over: the largest of the
// controller's own count (the nodes that answered and those that did not)
// and the count any answering node's lease keeps (NodeInfo.KnownNodes).
//
// A node's lease count never shrinks while it runs (lease.Monitor.SetPeers),
// but the controller's peer list may: one rendered from service discovery
// drops the nodes a partition hides. With five nodes and the list shrunk
// to the three on the controller's side, two of them would make a majority
// of three, while the cut-off primary still holds its lease with three of
// five (itself, a node beside it and one of the three): the majorities
// would not intersect (docs/safety.md, "Why the lease and failover
// majorities intersect"). Counting the largest membership any node
// reports keeps the failover's majority one of all five.
func Members(answered []Node, silent int) int {
	n := len(answered) + silent
	for _, a := range answered {
		n = max(n, a.Info.KnownNodes)
	}
	return n
}

// Majority reports whether the answering nodes are more than half of
// Members.
func Majority(answered []Node, silent int) bool {
	return len(answered) > Members(answered, silent)/2
}

// Unheard is how many nodes did not answer: the silent ones the
// controller's peer list names, and those only the nodes' lease counts
// know of (a list rendered from service discovery drops the nodes a
// partition hides). "No node holds it" is known only when it is 0: a node
// the list no longer names may hold the only copy.
func Unheard(answered []Node, silent int) int {
	return Members(answered, silent) - len(answered)
}

// AllAnswered reports whether every node answered: none is unheard and
// at least one answered (a peer list that names no node, or whose nodes
// all went silent, knows of no member; that is not knowing there is
// none). Only then is "no node holds it" known.
func AllAnswered(answered []Node, silent int) bool {
	return len(answered) > 0 && Unheard(answered, silent) == 0 && len(starting(answered)) == 0
}

// starting names the answering nodes that keep a lease but count no node
// yet. A node counts its peers once its own address has answered it as
// itself, at its first beat (lease.Monitor.Members), so just after a
// start it reports 0 as a node without a lease does; only the lease tells
// them apart (a node without one always holds it). Until such a node has
// counted, its silence about other nodes is not knowing there are none:
// with the controller's list shrunk by a partition and the nodes beside
// it just restarted, a delete found "every node" answered while the
// hidden node held the volume's primary (the fault simulation's seed
// 5102 with lying peers).
func starting(answered []Node) []string {
	var out []string
	for _, a := range answered {
		if a.Info.KnownNodes == 0 && !a.Info.LeaseHeld {
			out = append(out, a.Info.NodeID)
		}
	}
	return out
}

// Unlisted says, for an error, how many unheard nodes the controller's
// peer list does not name ("" if none), and what to do about them.
func Unlisted(answered []Node, silent int) string {
	if len(answered) == 0 && silent == 0 {
		return "no node answered: the controller's peer list names none"
	}
	if s := starting(answered); len(s) > 0 {
		return fmt.Sprintf("node(s) %s started a moment ago and count no peers yet (their first beat counts them): a node the controller's peer list does not name may be among them; retry in a few seconds", strings.Join(s, ", "))
	}
	n := Unheard(answered, silent) - silent
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf("%d more the nodes' leases count that the controller's peer list does not name (a node away from service discovery; one gone for good leaves the counts when the node plugins restart)", n)
}

// Witnesses is the witness set the answering nodes count (package
// witnesses; the empty set when none reports one): a generation's
// majorities are counted over it (migration's view). Every answering
// node must report the same set: two sets need not share a node, so
// while nodes disagree no such decision is taken (Unavailable).
func Witnesses(answered []Node) (witnesses.Set, error) {
	var (
		set  witnesses.Set
		from string
	)
	for i, n := range answered {
		s, err := witnesses.Parse(n.Info.Witnesses)
		if err != nil {
			return witnesses.Set{}, errdefs.Wrap(errdefs.ErrUnavailable, "node %s reports a witness set that does not parse (%v): correct its witnesses", n.Info.NodeID, err)
		}
		if i == 0 {
			set, from = s, n.Info.NodeID
			continue
		}
		if s.Digest() != set.Digest() {
			return witnesses.Set{}, errdefs.Wrap(errdefs.ErrUnavailable, "nodes %s and %s count different witness sets (%s and %s): no volume is created, moved or failed over until every node lists the same witnesses (docs/operations.md, \"Witnesses\")",
				from, n.Info.NodeID, witnesses.Describe(set.Entries(), ""), witnesses.Describe(s.Entries(), ""))
		}
	}
	return set, nil
}
