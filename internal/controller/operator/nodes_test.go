package operator

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// TestUnreachedSaysWhyInOneSentence: gRPC's wording of the usual causes
// (as cluster.Unreachable carries them) becomes one sentence naming the
// address and the cause.
func TestUnreachedSaysWhyInOneSentence(t *testing.T) {
	const addr = "10.0.0.2:7670"
	dial := func(cause string) error {
		return fmt.Errorf("agent %s: %w", addr, status.Error(codes.Unavailable,
			`connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.2:7670: `+cause+`"`))
	}
	tests := []struct {
		err  error
		want string
	}{
		{dial("connect: connection refused"), "nothing listens at 10.0.0.2:7670 (connection refused): is zfs-node running there"},
		{dial("i/o timeout"), "no answer from 10.0.0.2:7670 in time (i/o timeout): the host"},
		{dial("connect: no route to host"), "no answer from 10.0.0.2:7670 in time (no route to host)"},
		{fmt.Errorf("agent %s: %w", addr, status.Error(codes.Unavailable, "latest balancer error: name resolver error: produced zero addresses")), "the name in 10.0.0.2:7670 does not resolve"},
		{fmt.Errorf("agent %s: %w", addr, status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate signed by unknown authority"`)),
			"the TLS handshake with 10.0.0.2:7670 failed (certificate signed by unknown authority): check"},
		{fmt.Errorf("agent %s: %w", addr, status.Error(codes.DeadlineExceeded, "context deadline exceeded")), "no answer from 10.0.0.2:7670 in time"},
		{fmt.Errorf("agent %s: %w", addr, status.Error(codes.FailedPrecondition, "node n2 speaks agent protocol 2, this caller 1")), "10.0.0.2:7670 refused the call: node n2 speaks agent protocol 2"},
		{errors.New("something else: broken pipe"), "10.0.0.2:7670 did not answer: broken pipe"},
	}
	for _, tc := range tests {
		got := Unreached(addr, tc.err)
		if !strings.HasPrefix(got, tc.want) {
			t.Errorf("Unreached(%v) =\n%q, want it to start with\n%q", tc.err, got, tc.want)
		}
		if strings.Contains(got, "desc =") || strings.Contains(got, "rpc error") || strings.Contains(got, "balancer") {
			t.Errorf("Unreached(%v) = %q: gRPC's wording", tc.err, got)
		}
	}
}

func TestNodeStatuses(t *testing.T) {
	expires := time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC)
	nodes := []cluster.Node{
		{Addr: "a:1", Info: agentclient.NodeInfo{NodeID: "n1", Version: "v1", OpenZFS: "2.1.11", AvailableBytes: 5 << 30, Volumes: 3, KnownNodes: 3, LeaseHeld: true, CertificateNotAfter: expires}},
		{Addr: "b:1", Info: agentclient.NodeInfo{NodeID: "n2", UnhealthyReason: "pool tank is DEGRADED", KnownNodes: 2, RetiredNodes: []string{"n4"}}},
		{Addr: "c:1", Info: agentclient.NodeInfo{NodeID: "n3"}},
	}
	got := nodeStatuses(nodes, []cluster.Unreachable{{Addr: "d:1", Err: errors.New("dial: connection refused")}})
	want := []NodeStatus{
		{Node: "n1", Address: "a:1", Reachable: true, Healthy: true, DriverVersion: "v1", OpenZFSVersion: "2.1.11", AvailableBytes: 5 << 30, Volumes: 3, Lease: "held", KnownNodes: 3, CertificateExpires: "2027-01-02T03:04:05Z"},
		{Node: "n2", Address: "b:1", Reachable: true, Problem: "unhealthy: pool tank is DEGRADED", Lease: "lost", KnownNodes: 2, RetiredNodes: []string{"n4"}},
		{Node: "n3", Address: "c:1", Reachable: true, Healthy: true, Lease: "none"},
		{Node: "d:1", Address: "d:1", Problem: Unreached("d:1", errors.New("dial: connection refused"))},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("nodeStatuses =\n%+v, want\n%+v", got, want)
	}
	var out strings.Builder
	printNodes(&out, got, expires.Add(-49*time.Hour))
	for _, line := range []string{"n1    a:1      ok", "2d left", "UNREACHABLE", "d:1: nothing listens at d:1", "n2: unhealthy: pool tank is DEGRADED"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("the node table lacks %q:\n%s", line, out.String())
		}
	}
}

// TestVerdict: status's exit status, as monitoring scripts read it.
func TestVerdict(t *testing.T) {
	well := NodeStatus{Node: "n1", Reachable: true, Healthy: true, Lease: "held"}
	other := NodeStatus{Node: "n2", Reachable: true, Healthy: true, Lease: "none"}
	primary := CopyStatus{VolumeID: "v", Node: "n1", Role: "primary", Generation: 2}
	replica := CopyStatus{VolumeID: "v", Node: "n2", Role: "replica"}
	with := func(n NodeStatus, change func(*NodeStatus)) NodeStatus { change(&n); return n }
	receivedAt := func(c CopyStatus, at time.Time) CopyStatus { c.LastSnapshotTime = at; return c }
	holding := []ControllerStatus{{ID: "c1", HoldsWorkLease: true}, {ID: "c2"}}
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	replicated := primary
	replicated.parameters = map[string]string{"replicas": "2", "replication_interval": "1m"}
	fresh := CopyStatus{VolumeID: "v", Node: "n2", Role: "replica", LastSnapshotTime: now.Add(-3 * time.Minute)}
	late := CopyStatus{VolumeID: "v", Node: "n3", Role: "replica", LastSnapshotTime: now.Add(-5 * time.Minute)}
	third := NodeStatus{Node: "n3", Reachable: true, Healthy: true, Lease: "held"}
	tests := []struct {
		name   string
		report Report
		code   int
		why    string
	}{
		{"all well", Report{Nodes: []NodeStatus{well, other}, Copies: []CopyStatus{primary, replica}, Controllers: holding}, ExitHealthy, ""},
		{"no volumes", Report{Nodes: []NodeStatus{well}, Controllers: holding}, ExitHealthy, ""},
		{"replicas within their lag", Report{Nodes: []NodeStatus{well, other, third}, Copies: []CopyStatus{replicated, fresh, receivedAt(late, now.Add(-4*time.Minute))}, Controllers: holding}, ExitHealthy, ""},
		{"a replica missing", Report{Nodes: []NodeStatus{well, other}, Copies: []CopyStatus{replicated, fresh}, Controllers: holding}, ExitReplicasBehind, "v has 1 of 2 replicas"},
		{"a replica late", Report{Nodes: []NodeStatus{well, other, third}, Copies: []CopyStatus{replicated, fresh, late}, Controllers: holding}, ExitReplicasBehind, "v: replica late on n3"},
		{"a replica never received", Report{Nodes: []NodeStatus{well, other, third}, Copies: []CopyStatus{replicated, fresh, {VolumeID: "v", Node: "n3", Role: "replica"}}, Controllers: holding}, ExitReplicasBehind, "late on n3"},
		{"no work-lease holder comes before replicas", Report{Nodes: []NodeStatus{well, other}, Copies: []CopyStatus{replicated}}, ExitNoWorkLease, "work lease"},
		{"a node down comes before replicas", Report{Nodes: []NodeStatus{well, {Node: "x:1", Problem: "down"}}, Copies: []CopyStatus{replicated}, Controllers: holding}, ExitDegraded, "x:1"},
		{"no controller instance asked for the work lease", Report{Nodes: []NodeStatus{well, other}, Copies: []CopyStatus{primary, replica}}, ExitNoWorkLease, "no controller instance holds the work lease"},
		{"instances on standby only", Report{Nodes: []NodeStatus{well, other}, Copies: []CopyStatus{primary, replica}, Controllers: []ControllerStatus{{ID: "c1", GrantedBy: []string{"n1"}}, {ID: "c2"}}}, ExitNoWorkLease, "no controller instance holds the work lease"},
		{"a node unreachable", Report{Nodes: []NodeStatus{well, {Node: "x:1", Problem: "down"}}, Copies: []CopyStatus{primary}}, ExitDegraded, "x:1"},
		{"the same witnesses everywhere", Report{Nodes: []NodeStatus{with(well, func(n *NodeStatus) { n.Witnesses = []string{"n1@a:1", "n2@b:1", "n3@c:1"} }),
			with(other, func(n *NodeStatus) { n.Witnesses = []string{"n1@a:1", "n2@b:1", "n3@c:1"} })}, Copies: []CopyStatus{primary, replica}, Controllers: holding}, ExitHealthy, ""},
		{"nodes count different witness sets", Report{Nodes: []NodeStatus{with(well, func(n *NodeStatus) { n.Witnesses = []string{"n1@a:1", "n2@b:1", "n3@c:1"} }), other},
			Copies: []CopyStatus{primary, replica}, Controllers: holding}, ExitDegraded, "nodes n1 and n2 count different witness sets (n1@a:1,n2@b:1,n3@c:1; none (every node counts))"},
		{"a node unhealthy", Report{Nodes: []NodeStatus{well, with(other, func(n *NodeStatus) { n.Healthy = false })}, Copies: []CopyStatus{primary}}, ExitDegraded, "n2"},
		{"a node lost its lease", Report{Nodes: []NodeStatus{well, with(other, func(n *NodeStatus) { n.Lease = "lost" })}}, ExitDegraded, "n2"},
		{"the controller's moves unknown", Report{Nodes: []NodeStatus{well}, Unreachable: []Unreachable{{Node: "controller :9671"}}}, ExitDegraded, "controller :9671"},
		{"only a replica answered", Report{Nodes: []NodeStatus{other}, Copies: []CopyStatus{replica}}, ExitNoPrimary, "1 volume(s) without a healthy primary: v"},
		{"the primary's node lost its lease", Report{Nodes: []NodeStatus{with(well, func(n *NodeStatus) { n.Lease = "lost" }), other}, Copies: []CopyStatus{primary, replica}}, ExitNoPrimary, "v"},
		{"no node configured", Report{}, ExitNoPrimary, "names no node agent"},
		{"no node answered", Report{Nodes: []NodeStatus{{Node: "x:1", Problem: "down"}, {Node: "y:1", Problem: "down"}}}, ExitNoPrimary, "none of the 2 node agents answered"},
		{"two primaries in conflict", Report{Nodes: []NodeStatus{well, other}, Copies: []CopyStatus{
			{VolumeID: "v", Node: "n1", Role: "primary", Conflict: true}, {VolumeID: "v", Node: "n2", Role: "primary", Conflict: true}}}, ExitNoPrimary, "v"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, why := tc.report.Verdict(now)
			if code != tc.code || !strings.Contains(why, tc.why) {
				t.Errorf("Verdict = %d %q, want %d mentioning %q", code, why, tc.code, tc.why)
			}
		})
	}
}

func TestResolveAmong(t *testing.T) {
	data, logs := contract.VolumeIDForName("data"), contract.VolumeIDForName("logs")
	// A volume whose name is another volume's ID.
	confusing := contract.VolumeIDForName(data)
	copies := []CopyStatus{
		{VolumeID: data, Name: "data", Role: "primary"},
		{VolumeID: data, Name: "data", Role: "replica"},
		{VolumeID: logs, Name: "logs", Role: "replica"},
	}
	tests := []struct {
		copies       []CopyStatus
		arg, id, how string
		err          error
		errHas       string
	}{
		{copies, data, data, "", nil, ""},
		{copies, "data", data, `the volume named "data"`, nil, ""},
		{copies, "logs", logs, `the volume named "logs"`, nil, ""}, // only a replica answered
		{copies, contract.VolumeIDForName("gone"), contract.VolumeIDForName("gone"), "", nil, ""},
		{copies, "gone", "", "", errdefs.ErrNotFound, `no volume named "gone" or with that ID (the volumes are data, logs)`},
		{append(copies, CopyStatus{VolumeID: confusing, Name: data}), data, "", "", errdefs.ErrInvalidArgument, "is the ID of volume " + data + " and the name of volume " + confusing},
	}
	for _, tc := range tests {
		id, how, err := resolveAmong(tc.copies, tc.arg)
		if id != tc.id || how != tc.how || !errors.Is(err, tc.err) || (err != nil && !strings.Contains(err.Error(), tc.errHas)) {
			t.Errorf("resolveAmong(%q) = %q, %q, %v; want %q, %q, %v containing %q", tc.arg, id, how, err, tc.id, tc.how, tc.err, tc.errHas)
		}
	}
}

// TestEveryStatusFieldIsDocumented: docs/config.md names every field of
// status -json, as scripts read them.
func TestEveryStatusFieldIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	var walk func(reflect.Type)
	walk = func(typ reflect.Type) {
		for typ.Kind() == reflect.Slice || typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || typ == reflect.TypeOf(time.Time{}) {
			return
		}
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if name != "" && name != "-" && !strings.Contains(string(doc), "`"+name+"`") && !strings.Contains(string(doc), "`"+name+"[]`") {
				t.Errorf("docs/config.md does not name status -json's field %q (%s.%s)", name, typ.Name(), typ.Field(i).Name)
			}
			walk(typ.Field(i).Type)
		}
	}
	walk(reflect.TypeOf(Report{}))
}

// TestAProblemIsToldOnce: a node that did not answer is in the node
// table and in Unreachable (for scripts); the report tells it once, and
// still tells the controller that did not answer.
func TestAProblemIsToldOnce(t *testing.T) {
	r := Report{
		Nodes:       []NodeStatus{{Node: "10.0.0.4:7670", Address: "10.0.0.4:7670", Problem: "nothing listens at 10.0.0.4:7670"}},
		Unreachable: []Unreachable{{Node: "10.0.0.4:7670", Error: "nothing listens at 10.0.0.4:7670"}, {Node: "controller :9671", Error: "moves in progress unknown"}},
	}
	var out strings.Builder
	PrintStatus(&out, r, time.Now())
	if n := strings.Count(out.String(), "nothing listens"); n != 1 {
		t.Errorf("the node's problem is told %d times, want once:\n%s", n, out.String())
	}
	if !strings.Contains(out.String(), "unreachable: controller :9671: moves in progress unknown") {
		t.Errorf("the controller that did not answer is not told:\n%s", out.String())
	}
}
