package operator

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/witnesses"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// SchemaVersion is the version of status -json's form: raised when a
// field changes meaning or goes away (new fields do not raise it).
const SchemaVersion = 1

// NodeStatus is one node agent as status sees it.
type NodeStatus struct {
	// Node is the node's ID; its address when it did not answer.
	Node      string `json:"node"`
	Address   string `json:"address"`
	Reachable bool   `json:"reachable"`
	Healthy   bool   `json:"healthy"`
	// Problem says in one sentence why the node is unreachable or
	// unhealthy; empty when it is neither.
	Problem        string `json:"problem,omitempty"`
	DriverVersion  string `json:"driver_version,omitempty"`
	OpenZFSVersion string `json:"openzfs_version,omitempty"`
	AvailableBytes uint64 `json:"available_bytes"`
	Volumes        int64  `json:"volumes"`
	// Lease is "held", "lost" (the node hears no majority of its peers:
	// its mounted primaries are read-only) or "none" (it keeps none).
	Lease string `json:"lease,omitempty"`
	// KnownNodes is how many nodes the node's lease counts, itself
	// included (0: it keeps none); RetiredNodes the node retired on it
	// since it started (retire-node).
	KnownNodes   int      `json:"known_nodes,omitempty"`
	RetiredNodes []string `json:"retired_nodes,omitempty"`
	// Witnesses is the node's witness set (node_id@host:port each; absent:
	// every node counts); Witness whether the node is one of them.
	Witnesses []string `json:"witnesses,omitempty"`
	Witness   bool     `json:"witness,omitempty"`
	// CertificateExpires is when the node's agent certificate expires
	// (absent without TLS, or from a node of an older build).
	CertificateExpires string `json:"certificate_expires,omitempty"`
}

// nodeStatuses is the node view of cluster.Nodes' answer.
func nodeStatuses(nodes []cluster.Node, unreachable []cluster.Unreachable) []NodeStatus {
	out := []NodeStatus{}
	for _, n := range nodes {
		i := n.Info
		s := NodeStatus{Node: i.NodeID, Address: n.Addr, Reachable: true, Healthy: i.UnhealthyReason == "",
			DriverVersion: i.Version, OpenZFSVersion: i.OpenZFS, AvailableBytes: i.AvailableBytes, Volumes: i.Volumes,
			KnownNodes: i.KnownNodes, RetiredNodes: i.RetiredNodes, Witnesses: i.Witnesses}
		if set, err := witnesses.Parse(i.Witnesses); err == nil {
			s.Witness = set.Has(i.NodeID)
		}
		if !s.Healthy {
			s.Problem = "unhealthy: " + i.UnhealthyReason
		}
		switch {
		case i.KnownNodes == 0:
			s.Lease = "none"
		case i.LeaseHeld:
			s.Lease = "held"
		default:
			s.Lease = "lost"
		}
		if !i.CertificateNotAfter.IsZero() {
			s.CertificateExpires = i.CertificateNotAfter.UTC().Format("2006-01-02T15:04:05Z")
		}
		out = append(out, s)
	}
	for _, u := range unreachable {
		out = append(out, NodeStatus{Node: u.Addr, Address: u.Addr, Problem: Unreached(u.Addr, u.Err)})
	}
	return out
}

// Unreached says in one sentence why the agent at addr did not answer,
// without gRPC's wording: the cause and what to look at.
func Unreached(addr string, err error) string {
	msg := err.Error()
	var se interface{ GRPCStatus() *status.Status }
	if strings.Contains(msg, "rpc error: ") && errors.As(err, &se) && se.GRPCStatus().Code() != codes.Unknown {
		msg = se.GRPCStatus().Message() // without gRPC's "rpc error: code = ... desc =" prefix
	}
	cause := innermost(msg)
	switch {
	case strings.Contains(msg, "connection refused"):
		return fmt.Sprintf("nothing listens at %s (connection refused): is zfs-node running there, on that port?", addr)
	case strings.Contains(msg, "no such host") || strings.Contains(msg, "produced zero addresses"):
		return fmt.Sprintf("the name in %s does not resolve: check the peers list", addr)
	case tlsRefusal(msg):
		return fmt.Sprintf("the TLS handshake with %s failed (%s): check that its certificate and ours come from the same CA and are valid (docs/security.md)", addr, cause)
	case errdefs.Code(err) == codes.DeadlineExceeded || strings.Contains(msg, "i/o timeout") || strings.Contains(msg, "no route to host") || strings.Contains(msg, "deadline exceeded"):
		return fmt.Sprintf("no answer from %s in time (%s): the host, its zfs-node or the network to it is down", addr, cause)
	case errdefs.Code(err) == codes.FailedPrecondition:
		return fmt.Sprintf("%s refused the call: %s", addr, msg)
	}
	return fmt.Sprintf("%s did not answer: %s", addr, cause)
}

// tlsRefusal reports whether an error's message tells of a TLS
// handshake that failed: a certificate refused, which no retry mends.
func tlsRefusal(msg string) bool {
	return strings.Contains(msg, "certificate") || strings.Contains(msg, "tls:") || strings.Contains(msg, "x509")
}

// innermost is the last cause of a chain of "context: cause" messages,
// which is what gRPC's dial errors end with ("... dial tcp ADDR: connect:
// connection refused").
func innermost(msg string) string {
	msg = strings.TrimRight(strings.TrimSpace(msg), `"`)
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

// Exit statuses of zfs-controller status, for monitoring scripts (a
// command that fails exits 1, a wrong command line 2).
const (
	ExitHealthy = 0
	// ExitDegraded: a node (or a controller instance asked for its moves) did
	// not answer, or a node is unhealthy or lost its lease.
	ExitDegraded = 3
	// ExitNoPrimary: a volume has no healthy primary among the nodes
	// that answered: its data cannot be staged now.
	ExitNoPrimary = 4
	// ExitNoWorkLease: no controller instance holds the work lease:
	// nothing runs the replication and backup schedules.
	ExitNoWorkLease = 5
	// ExitReplicasBehind: a volume lacks replicas it asks for, or one is
	// older than twice its replication_interval plus two minutes (the
	// bound of the ZfsNomadReplicaLagAboveTarget alert).
	ExitReplicasBehind = 6
)

// replicaGrace is what a replica may lag beyond twice its interval: a
// schedule round and a push.
const replicaGrace = 2 * time.Minute

// Verdict is the report's exit status as of now and, unless healthy, a
// sentence saying why. When several hold, the first of: no healthy
// primary (4), a node not well (3), no work-lease holder (5), replicas
// behind (6).
func (r Report) Verdict(now time.Time) (int, string) {
	// Nothing heard is no news of health: no volume is known to have a
	// primary anyone could stage.
	answered := 0
	for _, n := range r.Nodes {
		if n.Reachable {
			answered++
		}
	}
	switch {
	case len(r.Nodes) == 0:
		return ExitNoPrimary, "the peer list names no node agent (peers, peers_file): no volume is known to have a healthy primary"
	case answered == 0:
		return ExitNoPrimary, fmt.Sprintf("none of the %d node agents answered: no volume is known to have a healthy primary", len(r.Nodes))
	}
	if vols := r.withoutHealthyPrimary(); len(vols) > 0 {
		return ExitNoPrimary, fmt.Sprintf("%d volume(s) without a healthy primary: %s", len(vols), strings.Join(vols, ", "))
	}
	var down []string
	for _, n := range r.Nodes {
		if !n.Reachable || !n.Healthy || n.Lease == "lost" {
			down = append(down, n.Node)
		}
	}
	for _, u := range r.unreachableBesidesNodes() {
		down = append(down, u.Node)
	}
	if len(down) > 0 {
		return ExitDegraded, fmt.Sprintf("not every node is well: %s", strings.Join(down, ", "))
	}
	if why := r.witnessesDiffer(); why != "" {
		return ExitDegraded, why
	}
	if !r.workLeaseHeld() {
		return ExitNoWorkLease, fmt.Sprintf("no controller instance holds the work lease: the replication and backup schedules and the pass over missed deletions do not run (is zfs-controller running, and reaching a majority of the nodes? a node that started within %s grants it to nobody yet)", worklease.Term)
	}
	if behind := r.replicasBehind(now); len(behind) > 0 {
		return ExitReplicasBehind, fmt.Sprintf("%d volume(s) with replicas missing or late: %s", len(behind), strings.Join(behind, "; "))
	}
	return ExitHealthy, ""
}

// replicasBehind says, for each volume whose primary asks for replicas,
// which it lacks or which are late as of now.
func (r Report) replicasBehind(now time.Time) []string {
	replicas := map[string][]CopyStatus{}
	for _, c := range r.Copies {
		if c.Role == "replica" {
			replicas[c.VolumeID] = append(replicas[c.VolumeID], c)
		}
	}
	var out []string
	seen := map[string]bool{}
	for _, p := range r.Copies {
		want, interval := contract.ReplicationPolicy(p.parameters)
		if p.Role != "primary" || p.Conflict || want == 0 || seen[p.VolumeID] {
			continue
		}
		seen[p.VolumeID] = true
		var late []string
		for _, c := range replicas[p.VolumeID] {
			if c.LastSnapshotTime.IsZero() || now.Sub(c.LastSnapshotTime) > 2*interval+replicaGrace {
				late = append(late, c.Node)
			}
		}
		have := len(replicas[p.VolumeID])
		switch {
		case have < want && len(late) > 0:
			out = append(out, fmt.Sprintf("%s has %d of %d replicas, late on %s", p.VolumeID, have, want, strings.Join(late, ", ")))
		case have < want:
			out = append(out, fmt.Sprintf("%s has %d of %d replicas", p.VolumeID, have, want))
		case len(late) > 0:
			out = append(out, fmt.Sprintf("%s: replica late on %s (older than twice its replication_interval %s, plus %s)", p.VolumeID, strings.Join(late, ", "), interval, replicaGrace))
		}
	}
	return out
}

// witnessesDiffer says which nodes count different witness sets ("" if
// every reachable node counts the same): the controller then creates,
// moves and fails over nothing (docs/operations.md, "Witnesses").
func (r Report) witnessesDiffer() string {
	first := -1
	for i, n := range r.Nodes {
		if !n.Reachable {
			continue
		}
		if first < 0 {
			first = i
			continue
		}
		if !slices.Equal(n.Witnesses, r.Nodes[first].Witnesses) {
			return fmt.Sprintf("nodes %s and %s count different witness sets (%s; %s): no volume is created, moved or failed over until every node lists the same witnesses",
				r.Nodes[first].Node, n.Node, witnesses.Describe(r.Nodes[first].Witnesses, ""), witnesses.Describe(n.Witnesses, ""))
		}
	}
	return ""
}

// workLeaseHeld reports whether a controller instance holds the work
// lease, as the nodes that answered grant it.
func (r Report) workLeaseHeld() bool {
	for _, c := range r.Controllers {
		if c.HoldsWorkLease {
			return true
		}
	}
	return false
}

// unreachableBesidesNodes are the entries of Unreachable that the node
// view does not already show: the controller instances asked for their moves.
func (r Report) unreachableBesidesNodes() []Unreachable {
	shown := map[string]bool{}
	for _, n := range r.Nodes {
		shown[n.Node] = n.Problem != ""
	}
	var out []Unreachable
	for _, u := range r.Unreachable {
		if !shown[u.Node] {
			out = append(out, u)
		}
	}
	return out
}

// withoutHealthyPrimary lists the volumes of the report that have no
// primary on a healthy node holding its lease, or only primaries in
// conflict.
func (r Report) withoutHealthyPrimary() []string {
	well := map[string]bool{}
	for _, n := range r.Nodes {
		well[n.Node] = n.Reachable && n.Healthy && n.Lease != "lost"
	}
	served := map[string]bool{}
	var order []string
	for _, c := range r.Copies {
		if _, seen := served[c.VolumeID]; !seen {
			served[c.VolumeID] = false
			order = append(order, c.VolumeID)
		}
		if c.Role == "primary" && !c.Conflict && well[c.Node] {
			served[c.VolumeID] = true
		}
	}
	var out []string
	for _, id := range order {
		if !served[id] {
			out = append(out, id)
		}
	}
	return out
}

// nodeFailed marks node id as unreachable for the reason given: it said
// who it is but not what it holds.
func (r *Report) nodeFailed(id, problem string) {
	for i := range r.Nodes {
		if r.Nodes[i].Node == id {
			r.Nodes[i].Reachable, r.Nodes[i].Problem = false, problem
		}
	}
}

// printNodes writes the node table, with each certificate's time left as
// of now, then the problems one sentence each.
func printNodes(out io.Writer, nodes []NodeStatus, now time.Time) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tADDRESS\tSTATE\tDRIVER\tOPENZFS\tFREE\tVOLUMES\tLEASE\tCERTIFICATE")
	for _, n := range nodes {
		state, free, volumes := "ok", contract.Bytes(int64(n.AvailableBytes)), fmt.Sprint(n.Volumes)
		switch {
		case !n.Reachable:
			state, free, volumes = "UNREACHABLE", "", ""
		case !n.Healthy:
			state = "UNHEALTHY"
		}
		lease := n.Lease
		if n.Witness {
			lease += " (witness)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Node, n.Address, state, n.DriverVersion, n.OpenZFSVersion, free, volumes, lease, certificateLeft(n.CertificateExpires, now))
	}
	tw.Flush()
	for _, n := range nodes {
		if n.Problem != "" {
			fmt.Fprintf(out, "  %s: %s\n", n.Node, n.Problem)
		}
	}
	fmt.Fprintln(out)
}

// certificateLeft renders an expiry as the time left ("expires in 29d").
func certificateLeft(expires string, now time.Time) string {
	t, err := time.Parse(time.RFC3339, expires)
	if err != nil {
		return ""
	}
	left := t.Sub(now)
	if left <= 0 {
		return "EXPIRED " + t.Format("2006-01-02")
	}
	return fmt.Sprintf("%dd left", int(left.Hours()/24))
}
