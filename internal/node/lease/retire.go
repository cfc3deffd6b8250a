package lease

import (
	"maps"
	"slices"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Retire makes this node (selfID) stop counting node nodeID, at the
// operator's word (zfs-controller retire-node): its answers no longer
// count for this node's lease, for Members or for the peers asked to
// confirm a primary, and the Server refuses its calls. Retiring is the
// one way a node's membership shrinks while it runs (docs/safety.md,
// "Retiring a node").
//
// The rule that keeps it safe: a node retires a peer only when it could
// attest the peer's silence for need (L+M: no answer to its pings and no
// call for that long, counted from its own start when it never heard
// from it), and from then on never hears it again. So nodeID counted
// this node for its lease for the last time before it went silent, as
// for any silent peer, and never will again. What changes is the
// count: a majority of the n-1 nodes left. A majority of n-1 and a
// majority of n share a node (more than (n-1)/2 and more than n/2 add
// up to more than n-1), so while some nodes have retired nodeID and
// others not, a lease of one and a failover counted by the other still
// intersect. That holds for one node only: with two retired nodes
// still running and granting failovers, a node that retired both takes
// its majority over n-2 while the failover counts n, and the two need
// not share a node (TestRetiringKeepsLeaseAndFailoverApart finds it).
// So a node retires one node per start: a second waits until it
// restarted, when its list, rendered from the agents' service, no
// longer names the first.
//
// Retiring a node already retired is a no-op. The retirement lasts
// until this node restarts, when it counts the peers its list names
// then: the retired node's agent, gone from the agents' service, is
// not among them.
func (m *Monitor) Retire(selfID, nodeID string, need time.Duration) error {
	if nodeID == "" || nodeID == selfID {
		return errdefs.Wrap(errdefs.ErrInvalidArgument, "node %s cannot retire %q: name another node (a node is retired by the others, once it is stopped)", selfID, nodeID)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.retired[nodeID] {
		return nil
	}
	if m.witnesses.Has(nodeID) {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s is a witness: every majority counts it until the witness set changes (docs/operations.md, \"Witnesses\"), so it cannot be retired on its own", nodeID)
	}
	for other := range m.retired {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s retired %s since it started, and retires one node per start: restart its node plugin (it then counts the peers its list names), then retire %s (docs/operations.md, \"Retiring\")", selfID, other, nodeID)
	}
	if len(m.peers) == 0 {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s knows no peers (none configured, or its peers file not read yet), so it counts no node to retire", selfID)
	}
	last := m.called[nodeID]
	for _, p := range m.peers {
		if p.nodeID == nodeID && p.heard.After(last) {
			last = p.heard
		}
	}
	if silent := m.silentSince(m.now(), last); silent < need {
		return errdefs.Wrap(errdefs.ErrFailedPrecondition, "node %s heard from %s %s ago: a node is retired only once it has been silent for %s (%s more); stop its node plugin first (docs/operations.md, \"Retiring\") and retry",
			selfID, nodeID, silent.Round(time.Second), need, (need - silent).Round(time.Second))
	}
	m.retired[nodeID] = true
	return nil
}

// RetiredNodes lists the nodes retired on this node since it started.
func (m *Monitor) RetiredNodes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.retired))
}

// Retired reports whether nodeID was retired on this node.
func (m *Monitor) Retired(nodeID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.retired[nodeID]
}
