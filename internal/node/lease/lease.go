// Package lease tells a node whether it may keep writing to its primaries:
// it holds the lease while it heard from a majority of all its peers,
// every replication domain, itself included, within the lease time L. A
// node cut off from that majority makes its mounted primaries read-only
// (docs/safety.md, "Leases"), so that by the time the others could fail
// a volume over it writes nothing any more. The failover's majority is
// taken over all the nodes too, so the two majorities share a node
// (docs/safety.md, "Why the lease and failover majorities intersect").
// With a witness set (UseWitnesses) both count a majority of the
// witnesses instead, and a node pings only them (docs/safety.md,
// "Witnesses").
//
// Two kinds of hearing, for two uses. For its lease a node counts only a
// round trip it started: its ping to the peer was answered, which proves
// the peer recorded hearing this node (below) no earlier than the ping
// was sent. To attest a peer silent it counts anything that shows the
// peer was alive and talking to it: an answer to its own ping, and the
// peer's own authenticated Ping and Promises calls (Called). Each use
// leans the safe way: a lease is kept on less, silence attested on more.
//
// The driver's words (generation, promise, fence, lease, set aside,
// tombstone, ...) are defined in docs/glossary.md.
package lease

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
)

// ErrNoLease is Attest's refusal on a node configured without peers: it
// keeps no lease, and the nodes it would vouch for keep none either.
var ErrNoLease = errors.New("this node has no peers configured, so it holds no lease")

// Monitor keeps, on the monotonic clock, when each peer last answered
// and when each last called.
type Monitor struct {
	lease time.Duration
	now   func() time.Time

	mu      sync.Mutex
	started time.Time
	peers   map[string]*peer // by address
	// called: when each node (by the node ID of its verified certificate)
	// last called this node's Ping or Promises. Bounded by the node
	// certificates the operator's CA issued.
	called map[string]time.Time
	// needsPeers: the node is configured with peers (RequirePeers), so
	// knowing none yet means it has not learned them, not that it is a
	// domain of one.
	needsPeers bool
	// retired: the node IDs the operator retired (Retire). None of them
	// counts for anything again until this node restarts.
	retired map[string]bool
	// witnesses: when not empty, the set every majority counts over
	// (UseWitnesses); empty, every peer counts.
	witnesses witnesses.Set
}

// RequirePeers tells the monitor the node is configured with peers: until
// it knows one (the first beat, a peers file not rendered yet), it holds
// no lease and attests no silence. Without it, a node that had just
// started granted a failover away from a primary that still held its
// lease (found by the fault-injection simulation, seeds 1593 and 2786).
func (m *Monitor) RequirePeers() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.needsPeers = true
}

type peer struct {
	heard   time.Time // this node's ping last answered; zero: never
	nodeID  string    // "" until it answered once
	lastErr error     // why the last ping that failed failed; nil: none did
}

// NewMonitor returns a monitor of lease time lease. now is time.Now
// outside tests (its readings carry the monotonic clock, so wall clock
// steps do not move a lease).
func NewMonitor(lease time.Duration, now func() time.Time) *Monitor {
	return &Monitor{lease: lease, now: now, started: now(), peers: map[string]*peer{}, called: map[string]time.Time{}, retired: map[string]bool{}}
}

// UseWitnesses makes the monitor count over the witness set w instead of
// over all its peers (package witnesses): the lease is held while a
// majority of w answered within L, this node counting itself only if it
// is a witness; the peers pinged and asked to confirm are the witnesses,
// other than selfID, at their configured addresses, each expected to
// answer as its configured node; and a failover is attested by node
// identity (AttestFailover). Call it before the first beat; the peers
// file then no longer changes what the lease counts (SetPeers).
func (m *Monitor) UseWitnesses(selfID string, w witnesses.Set) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.witnesses = w
	m.peers = map[string]*peer{}
	for _, id := range w.IDs() {
		if id != selfID {
			m.peers[w.Addr(id)] = &peer{nodeID: id}
		}
	}
}

// SetPeers adds the peer addresses not known yet. An address once listed
// stays until the node restarts, even when a re-read peers file drops it:
// a peers file rendered from service discovery drops the nodes a
// partition hides, and a membership that shrank with them would let a
// cut-off node count itself a majority. Its own address may be among
// them: the node's answer to itself names it, and from then on it counts
// once, as itself.
//
// With witnesses (UseWitnesses) it does nothing: the lease counts the
// witnesses, whatever the peers file lists.
func (m *Monitor) SetPeers(addrs []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.witnesses.Empty() {
		return
	}
	for _, a := range addrs {
		if _, ok := m.peers[a]; !ok {
			m.peers[a] = &peer{}
		}
	}
}

// Answered records that the peer at addr answered a ping now, naming
// itself. A witness's address must answer as that witness: any other
// node's answer there counts for nothing (it is recorded as the ping's
// failure, for Silent).
func (m *Monitor) Answered(addr, nodeID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.peers[addr]
	switch {
	case !ok:
	case !m.witnesses.Empty() && nodeID != p.nodeID:
		p.lastErr = fmt.Errorf("answered as node %s, while the witness list names %s at this address: correct witnesses", nodeID, p.nodeID)
	default:
		p.heard, p.nodeID = m.now(), nodeID
	}
}

// Failed records why a ping to the peer at addr failed, for Silent.
func (m *Monitor) Failed(addr string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.peers[addr]; ok {
		p.lastErr = err
	}
}

// Silent describes each peer address (selfID's own excluded) that did
// not answer within the lease: when it last answered and why its last
// failed ping failed. A lost lease is logged with it, so the log says
// which peers went silent and whether the network, a certificate or a
// slow beat is to blame.
func (m *Monitor) Silent(selfID string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	var out []string
	for _, a := range slices.Sorted(maps.Keys(m.peers)) {
		p := m.peers[a]
		if p.nodeID == selfID || m.retired[p.nodeID] || (!p.heard.IsZero() && now.Sub(p.heard) < m.lease) {
			continue
		}
		d := a
		if p.nodeID != "" {
			d += " (" + p.nodeID + ")"
		}
		if p.heard.IsZero() {
			d += ": never answered"
		} else {
			d += fmt.Sprintf(": last answered %s ago", now.Sub(p.heard).Round(100*time.Millisecond))
		}
		if p.lastErr != nil {
			d += ": " + p.lastErr.Error()
		}
		out = append(out, d)
	}
	return out
}

// Called records that the node nodeID (its verified certificate's name)
// called this node now: it is alive and reaches this node, so this node
// attests no silence of it for the next L+M, even when this node's own
// pings to it fail (a link that can be dialled one way only). It does not
// count for this node's lease: the caller may not have heard this node's
// answer (see the package comment).
func (m *Monitor) Called(nodeID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.called[nodeID] = m.now()
}

// Held reports whether this node (selfID) heard from a majority of all
// its peers, whatever their domain, within the lease time: the failover's
// majority is taken over all the nodes, and only a majority of the same
// set is sure to share a node with it. A peer that never answered counts
// against it. With no peer at all the node is alone and always holds
// the lease.
func (m *Monitor) Held(selfID string) bool {
	if m.learning() {
		return false
	}
	heard, total := m.count(selfID)
	return heard > total/2
}

// learning reports whether the node is configured with peers but knows
// none yet.
func (m *Monitor) learning() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.needsPeers && len(m.peers) == 0
}

// Members returns how many nodes this node's lease counts, itself
// included: every peer address it was given since it started, less the
// nodes the operator retired (Retire). Nothing else shrinks it: the controller takes its majorities over the largest count a
// node reports (cluster.Members), so that they intersect this node's
// lease majority even when the controller's own peer list lost nodes.
// It is 0 (nothing to report) until the node has found its own address
// among its peers (its own ping answered naming it): until then that
// address would count as one more node, and a node that has just started
// would raise every majority by one (found on real ZFS: a returning
// node's count of four in a cluster of three refused a publish that only
// needed two of three). A node whose peers do not list itself never
// reports one, and the controller counts its own list.
//
// With witnesses it counts node identities: this node, the witnesses and
// every node that called it since it started, less the retired. Every
// node pings every witness each beat, so a witness knows them all; the
// controller takes the largest count, as without witnesses (its
// majorities of a generation count the witnesses, but "no node holds
// it" and the work lease still count every node).
func (m *Monitor) Members(selfID string) int {
	m.mu.Lock()
	if !m.witnesses.Empty() {
		defer m.mu.Unlock()
		return m.knownIDs(selfID)
	}
	knowsItself := false
	for _, p := range m.peers {
		knowsItself = knowsItself || p.nodeID == selfID
	}
	m.mu.Unlock()
	if !knowsItself {
		return 0
	}
	_, total := m.count(selfID)
	return total
}

// count returns how many of the nodes this node knows, itself included,
// answered its pings within the lease (this node always), and how many
// there are. Only answers count, not calls (Called).
//
// Nodes are counted by identity, not by address: a peer that answered
// names itself with its certificate's node ID, and a node listed under
// two addresses (by name and by IP) counts once, heard if either address
// answered within the lease. An address that never answered counts as a
// node of its own: it may be an alias of a known node, but counting it
// only makes a majority harder to reach.
//
// With witnesses only they count: this node only if it is one.
func (m *Monitor) count(selfID string) (heard, total int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if !m.witnesses.Empty() {
		return m.countWitnesses(now, selfID)
	}
	fresh := map[string]bool{} // node ID -> heard within the lease
	unnamed := 0
	for _, p := range m.peers {
		switch {
		case p.nodeID == selfID, m.retired[p.nodeID]:
		case p.nodeID == "":
			unnamed++
		default:
			fresh[p.nodeID] = fresh[p.nodeID] || (!p.heard.IsZero() && now.Sub(p.heard) < m.lease)
		}
	}
	heard, total = 1, 1+unnamed+len(fresh)
	for _, ok := range fresh {
		if ok {
			heard++
		}
	}
	return heard, total
}

// knownIDs is Members with witnesses. The caller holds m.mu.
func (m *Monitor) knownIDs(selfID string) int {
	known := map[string]bool{selfID: true}
	for _, id := range m.witnesses.IDs() {
		known[id] = true
	}
	for id := range m.called {
		known[id] = true
	}
	for id := range m.retired {
		delete(known, id)
	}
	return len(known)
}

// countWitnesses is count over the witnesses. Each witness other than
// selfID is one peer (UseWitnesses), and none is retired (Retire refuses
// them). The caller holds m.mu.
func (m *Monitor) countWitnesses(now time.Time, selfID string) (heard, total int) {
	if m.witnesses.Has(selfID) {
		heard = 1
	}
	for _, p := range m.peers {
		if !p.heard.IsZero() && now.Sub(p.heard) < m.lease {
			heard++
		}
	}
	return heard, m.witnesses.Len()
}

// votes reports whether selfID's own word counts toward a majority of
// its lease's set, and how many nodes that set has.
func (m *Monitor) votes(selfID string) (self bool, total int) {
	_, total = m.count(selfID)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.witnesses.Empty() || m.witnesses.Has(selfID), total
}

// Attest checks that none of addrs answered this node's pings nor called
// it for at least need (counted from this node's start when one never
// did): a failover away from them is then safe, since a primary among
// them that heard from no majority for the lease made itself read-only,
// and one that heard from a majority was heard by a node of every
// majority. A node without peers keeps no lease and cannot attest
// anything: it refuses with ErrNoLease. Answering nil would grant a
// failover at once with the binary's default of no peers, while the lost
// primary, which keeps no lease either, may still write.
//
// A call names a node ID, a peer is listed by address: the two meet once
// the peer answered a ping naming itself. A peer that never answered may
// be any caller whose node ID no answer named, so its silence is the
// silence of all of them.
func (m *Monitor) Attest(addrs []string, need time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.peers) == 0 {
		if m.needsPeers {
			return fmt.Errorf("this node has not learned its peers yet (it has just started, or its peers file lists none), so it cannot tell how long %s has been silent", strings.Join(addrs, ", "))
		}
		return fmt.Errorf("%w and cannot vouch that the node at %s stopped writing: configure peers on every node (docs/safety.md, \"Leases\") for automatic failover, or have an operator promote a replica with zfs-controller promote",
			ErrNoLease, strings.Join(addrs, ", "))
	}
	now := m.now()
	for _, a := range addrs {
		p, ok := m.peers[a]
		if !ok {
			return fmt.Errorf("%s is not among this node's peers, so this node cannot tell how long it has been silent", a)
		}
		if silent := m.silentSince(now, m.lastHeard(p)); silent < need {
			return fmt.Errorf("%s answered this node %s ago; a failover away from it waits until it has been silent for %s (%s more), when a primary there has made itself read-only",
				a, silent.Round(time.Second), need, (need - silent).Round(time.Second))
		}
	}
	return nil
}

// AttestFailover is Attest for a failover's reservation: of the addresses
// from (the agents the controller could not reach) and of every peer this
// node knows (selfID excluded) whose node ID is not among answering (the
// nodes that answered the controller). The controller's peer list may
// have lost nodes that a partition hid from service discovery; it cannot
// name them, but this node, whose peers never shrink, still attests that
// they are silent. A peer that never answered this node may be any node,
// so it is attested too. With nobody silent there is nothing to attest.
//
// With witnesses a failover is attested by node identity, since a node
// pings only the witnesses and knows no address of the others: this node
// must have been up for need (any node it never heard from was silent
// that long), and every node it heard from, by an answer or a call, that
// is neither selfID nor among answering must have been silent for need
// (attestBeyond). from is then not needed: its nodes are among those.
func (m *Monitor) AttestFailover(selfID string, from, answering []string, need time.Duration) error {
	if m.hasWitnesses() {
		return m.attestBeyond(selfID, answering, need)
	}
	silent := m.beyond(selfID, from, answering)
	if len(silent) == 0 {
		return nil
	}
	return m.Attest(silent, need)
}

func (m *Monitor) hasWitnesses() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.witnesses.Empty()
}

// attestBeyond is AttestFailover with witnesses: see there.
func (m *Monitor) attestBeyond(selfID string, answering []string, need time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	if up := now.Sub(m.started); up < need {
		return fmt.Errorf("this node started %s ago; it attests a failover once it has been up for %s (%s more), since a node it has not heard from since its start may have been writing before it",
			up.Round(time.Second), need, (need - up).Round(time.Second))
	}
	last := maps.Clone(m.called) // node ID -> when last heard
	for _, p := range m.peers {
		if p.heard.After(last[p.nodeID]) {
			last[p.nodeID] = p.heard
		}
	}
	for _, id := range slices.Sorted(maps.Keys(last)) {
		if id == selfID || slices.Contains(answering, id) {
			continue
		}
		if silent := now.Sub(last[id]); silent < need {
			return fmt.Errorf("node %s, which did not answer the controller, was heard here %s ago; a failover waits until it has been silent for %s (%s more), when a primary there has made itself read-only",
				id, silent.Round(time.Second), need, (need - silent).Round(time.Second))
		}
	}
	return nil
}

// beyond returns from and the addresses of the peers whose node ID is
// neither selfID nor among answering, sorted, each once.
func (m *Monitor) beyond(selfID string, from, answering []string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	set := map[string]bool{}
	for _, a := range from {
		set[a] = true
	}
	for a, p := range m.peers {
		if p.nodeID != selfID && !slices.Contains(answering, p.nodeID) {
			set[a] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// silentSince is how long a peer last heard at last (zero: never) has
// been silent at now: counted from this node's start when it was never
// heard, since this node cannot tell what came before. The caller holds
// m.mu.
func (m *Monitor) silentSince(now, last time.Time) time.Duration {
	if last.IsZero() {
		last = m.started
	}
	return now.Sub(last)
}

// lastHeard is when p last answered this node or called it (zero for
// never). The caller holds m.mu.
func (m *Monitor) lastHeard(p *peer) time.Time {
	last := p.heard
	later := func(t time.Time) {
		if t.After(last) {
			last = t
		}
	}
	if p.nodeID != "" {
		later(m.called[p.nodeID])
		return last
	}
	named := map[string]bool{}
	for _, q := range m.peers {
		named[q.nodeID] = true
	}
	for id, at := range m.called {
		if !named[id] {
			later(at)
		}
	}
	return last
}

// Peers returns the addresses to ping.
func (m *Monitor) Peers() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.peers))
	for a := range m.peers {
		out = append(out, a)
	}
	return out
}

// nodeOf returns the node ID the peer at addr last answered a ping with
// ("" if none).
func (m *Monitor) nodeOf(addr string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.peers[addr]; ok {
		return p.nodeID
	}
	return ""
}

// others returns an address of each peer node that answered a ping, of
// every domain, this node excluded: those a lift or a confirmation asks.
// A node listed under two addresses is asked once, at the address that
// answered last, so that its answer counts once.
func (m *Monitor) others(selfID string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	best := map[string]string{} // node ID -> address
	for a, p := range m.peers {
		if p.nodeID == "" || p.nodeID == selfID || m.retired[p.nodeID] {
			continue
		}
		if b, ok := best[p.nodeID]; !ok || p.heard.After(m.peers[b].heard) || (p.heard.Equal(m.peers[b].heard) && a < b) {
			best[p.nodeID] = a
		}
	}
	return slices.Sorted(maps.Values(best))
}
