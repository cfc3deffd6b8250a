package cluster

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// Candidate is a node as placement sees it.
type Candidate struct {
	NodeID     string
	Topology   map[string]string
	Available  uint64
	MaxQuota   uint64
	Volumes    int64
	MaxVolumes int64
}

// Requirement is what a new volume needs of its node.
type Requirement struct {
	Bytes uint64
	// Requisite: the node must match one of these segments (all keys of it).
	// Empty means any node.
	Requisite []map[string]string
	// Preferred: nodes matching earlier segments come first.
	Preferred []map[string]string
	// Node pins the volume to one node ID ("" for any).
	Node string
	// Among, when set, are the only node IDs that may hold it: those
	// holding its source (a clone lives where its source does).
	Among []string
	// Policy is "most-free" or "fewest-volumes".
	Policy string
}

// ErrNoMatchingNode marks Place's failure to find any node that matches
// the requirement (whatever their room).
var ErrNoMatchingNode = errors.New("no reachable, healthy node matches the topology requirement")

// Place returns the nodes that can hold the volume, best first. It fails
// with ErrOutOfRange when the size is above every node's ceiling, and with
// ErrResourceExhausted when nodes match but none has room.
func Place(cands []Candidate, req Requirement) ([]Candidate, error) {
	var matching []Candidate
	for _, c := range cands {
		if (req.Node == "" || c.NodeID == req.Node) && (req.Among == nil || slices.Contains(req.Among, c.NodeID)) && matchesAny(c.Topology, req.Requisite) {
			matching = append(matching, c)
		}
	}
	if len(matching) == 0 {
		return nil, fmt.Errorf("%w: %w%s", errdefs.ErrResourceExhausted, ErrNoMatchingNode, describeNode(req.Node, req.Among))
	}
	var fitting []Candidate
	var largestCeiling uint64
	for _, c := range matching {
		largestCeiling = max(largestCeiling, c.MaxQuota)
		if c.MaxQuota >= req.Bytes && c.Available >= req.Bytes && (c.MaxVolumes == 0 || c.Volumes < c.MaxVolumes) {
			fitting = append(fitting, c)
		}
	}
	if len(fitting) == 0 {
		if req.Bytes > largestCeiling {
			return nil, fmt.Errorf("%w: %d bytes is above the maximum volume size of every matching node (largest: %d)", errdefs.ErrOutOfRange, req.Bytes, largestCeiling)
		}
		return nil, fmt.Errorf("%w: no matching node has %d bytes free or room for another volume", errdefs.ErrResourceExhausted, req.Bytes)
	}
	sort.SliceStable(fitting, func(i, j int) bool {
		a, b := fitting[i], fitting[j]
		if pa, pb := preferenceRank(a.Topology, req.Preferred), preferenceRank(b.Topology, req.Preferred); pa != pb {
			return pa < pb
		}
		if req.Policy == "fewest-volumes" && a.Volumes != b.Volumes {
			return a.Volumes < b.Volumes
		}
		if a.Available != b.Available {
			return a.Available > b.Available
		}
		return a.NodeID < b.NodeID
	})
	return fitting, nil
}

func describeNode(node string, among []string) string {
	switch {
	case node != "":
		return fmt.Sprintf(" and the %q parameter (%s)", "node", node)
	case among != nil:
		return fmt.Sprintf(" among the nodes holding its source (%s)", strings.Join(among, ", "))
	}
	return ""
}

// Matches reports whether a node's topology holds every key of segment.
func Matches(topology, segment map[string]string) bool {
	for k, v := range segment {
		if topology[k] != v {
			return false
		}
	}
	return true
}

func matchesAny(topology map[string]string, segments []map[string]string) bool {
	if len(segments) == 0 {
		return true
	}
	for _, s := range segments {
		if Matches(topology, s) {
			return true
		}
	}
	return false
}

// preferenceRank is the index of the first preferred segment the node
// matches, or len(preferred) when it matches none.
func preferenceRank(topology map[string]string, preferred []map[string]string) int {
	for i, s := range preferred {
		if Matches(topology, s) {
			return i
		}
	}
	return len(preferred)
}

// CandidateOf is node n as placement sees it.
func CandidateOf(n Node) Candidate {
	return Candidate{
		NodeID: n.Info.NodeID, Topology: n.Info.Topology,
		Available: n.Info.AvailableBytes, MaxQuota: n.Info.MaxQuotaBytes,
		Volumes: n.Info.Volumes, MaxVolumes: n.Info.MaxVolumes,
	}
}

// PlaceNodes is Place over nodes: those that can hold the volume, best
// first.
func PlaceNodes(nodes []Node, req Requirement) ([]Node, error) {
	byID := make(map[string]Node, len(nodes))
	cands := make([]Candidate, 0, len(nodes))
	for _, n := range nodes {
		byID[n.Info.NodeID] = n
		cands = append(cands, CandidateOf(n))
	}
	placed, err := Place(cands, req)
	if err != nil {
		return nil, err
	}
	out := make([]Node, 0, len(placed))
	for _, p := range placed {
		out = append(out, byID[p.NodeID])
	}
	return out, nil
}

// ReplicaTargets returns up to want nodes to hold replicas of a volume of
// bytes whose primary is on source: first the holders (nodes that hold a
// replica, or are being given one), in the order given, then the nodes
// of source's replication domain that Place ranks best. Replicas stay in
// the source's domain: that is where the volume may move
// (docs/migration.md). The schedule and the operator's backup both choose
// with it. When fewer than want can be placed, err says why no more.
func ReplicaTargets(source Node, bytes uint64, want int, holders, healthy []Node) ([]Node, error) {
	var out []Node
	taken := map[string]bool{source.Info.NodeID: true}
	for _, h := range holders {
		if len(out) < want && !taken[h.Info.NodeID] {
			out = append(out, h)
			taken[h.Info.NodeID] = true
		}
	}
	if len(out) == want {
		return out, nil
	}
	domain := source.Info.Topology[config.TopologyDomainKey]
	var others []Node
	for _, n := range healthy {
		if !taken[n.Info.NodeID] && n.Info.Topology[config.TopologyDomainKey] == domain {
			others = append(others, n)
		}
	}
	if len(others) == 0 {
		return out, fmt.Errorf("%w: no healthy node other than the volume's own and its replicas' in replication domain %q", errdefs.ErrResourceExhausted, domain)
	}
	placed, err := PlaceNodes(others, Requirement{Bytes: max(1, bytes)})
	for _, n := range placed {
		if len(out) == want {
			break
		}
		out = append(out, n)
	}
	return out, err
}
