// Package witnesses is the operator's witness set: a fixed, odd number of
// nodes over which, when it is configured, the cluster counts its
// majorities (a node's lease, the attestations of a failover, the
// promises of a generation), instead of over all its nodes. Any two
// majorities of one set share a node whatever the set, so the safety
// argument holds over the witnesses as it does over all the nodes
// (docs/safety.md, "Why the lease and failover majorities intersect"),
// while a node pings the witnesses only: its beat no longer grows with
// the cluster.
//
// Every node and the controller must count the same set: a digest of it
// travels with the calls that count, and a call whose digest differs is
// refused.
package witnesses

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
)

// MaxSize bounds the set: every witness answers every node's pings, and
// nine tolerate the loss of four.
const MaxSize = 9

// Set is the witness set: node IDs and their agent addresses. The zero
// Set is empty: no witnesses, every majority counted over all the nodes.
type Set struct {
	addrs map[string]string // node ID -> agent address (host:port)
}

// Parse reads the set from entries of the form node_id@host:port. An
// empty list is the empty set. The set must have an odd number of
// witnesses, 3 to MaxSize (one witness would make one node the cluster's
// only vote; an even number tolerates no more losses than the odd number
// below it), each with its own node ID and address.
func Parse(entries []string) (Set, error) {
	if len(entries) == 0 {
		return Set{}, nil
	}
	if n := len(entries); n < 3 || n > MaxSize || n%2 == 0 {
		return Set{}, fmt.Errorf("witnesses lists %d nodes: list an odd number from 3 to %d (node_id@host:port each), in separate failure domains: a majority of them must stay up for any node to keep writing", n, MaxSize)
	}
	s := Set{addrs: map[string]string{}}
	seen := map[string]string{} // address -> node ID
	for _, e := range entries {
		id, addr, ok := strings.Cut(strings.TrimSpace(e), "@")
		if !ok || id == "" {
			return Set{}, fmt.Errorf("witness %q: write node_id@host:port (the node's node_id and its agent address)", e)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return Set{}, fmt.Errorf("witness %q: the address after @ must be host:port: %v", e, err)
		}
		if _, dup := s.addrs[id]; dup {
			return Set{}, fmt.Errorf("witness %q: node %s is listed twice; list each witness once", e, id)
		}
		if other, dup := seen[addr]; dup {
			return Set{}, fmt.Errorf("witness %q: address %s is also node %s's; each witness needs its own agent address", e, addr, other)
		}
		s.addrs[id], seen[addr] = addr, id
	}
	return s, nil
}

// Empty reports whether no witnesses are configured.
func (s Set) Empty() bool { return len(s.addrs) == 0 }

// Len is how many witnesses there are.
func (s Set) Len() int { return len(s.addrs) }

// Has reports whether node nodeID is a witness.
func (s Set) Has(nodeID string) bool {
	_, ok := s.addrs[nodeID]
	return ok
}

// Addr is witness nodeID's agent address ("" if it is not one).
func (s Set) Addr(nodeID string) string { return s.addrs[nodeID] }

// IDs lists the witnesses' node IDs, sorted.
func (s Set) IDs() []string { return slices.Sorted(maps.Keys(s.addrs)) }

// Majority reports whether the nodes in ids (each counted once) are a
// majority of the set. Nodes that are not witnesses do not count.
func (s Set) Majority(ids []string) bool {
	n := 0
	for _, id := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		if s.Has(id) {
			n++
		}
	}
	return n > s.Len()/2
}

// Digest names the set: equal for equal sets, whatever the order they
// were listed in, and "" for the empty set.
func (s Set) Digest() string {
	if s.Empty() {
		return ""
	}
	h := sha256.New()
	for _, id := range s.IDs() {
		fmt.Fprintf(h, "%s@%s\n", id, s.addrs[id])
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Entries lists the set as Parse reads it (node_id@host:port), sorted
// by node ID: Parse(s.Entries()) is s.
func (s Set) Entries() []string {
	out := make([]string, 0, s.Len())
	for _, id := range s.IDs() {
		out = append(out, id+"@"+s.addrs[id])
	}
	return out
}

// String lists the set as it is configured, sorted by node ID.
func (s Set) String() string { return strings.Join(s.Entries(), ",") }

// Describe names a witness set in a message, from its entries when the
// caller has them, else from its digest (what a ping or a reservation
// carries): "none (every node counts)" for the empty set.
func Describe(entries []string, digest string) string {
	switch {
	case len(entries) > 0:
		return strings.Join(entries, ",")
	case digest == "":
		return "none (every node counts)"
	}
	return "with digest " + digest
}
