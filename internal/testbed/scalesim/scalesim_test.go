package scalesim

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
)

var (
	sizes   = flag.String("scale-nodes", "", "node counts TestScaleFigures measures at (make scale: 3,10,30,100); empty skips it")
	volumes = flag.Int("scale-volumes", 100, "volumes per node TestScaleFigures creates")
	beats   = flag.Int("scale-beats", 4, "heartbeat intervals TestScaleFigures measures the quiet cluster over")
	wits    = flag.Int("scale-witnesses", 0, "witnesses TestScaleFigures configures (the first nodes; 0: none, every node counts)")
)

// TestScale runs the measurement on a small cluster with the shortest
// lease and checks what it reports: every volume made, every lease held,
// each node pinged by each peer once a beat, a publish and a move that
// succeed, plans, and a failover granted no sooner than the lease and its
// margin allow.
func TestScale(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a lost node's lease and margin, about 22 s")
	}
	const nodes, perNode, lease = 4, 3, 2 * time.Second
	r, err := Run(context.Background(), Config{Nodes: nodes, VolumesPerNode: perNode, Latency: time.Millisecond, Beats: 4, Samples: 2, Parallel: 4, Lease: lease, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(row(r))
	if r.Volumes != nodes*perNode {
		t.Errorf("%d volumes made, want %d", r.Volumes, nodes*perNode)
	}
	interval := lease / 4
	want := float64(nodes-1) / interval.Seconds()
	if got := r.CallsPerNodeSecond["Peers/Ping"]; math.Abs(got-want) > want/2 {
		t.Errorf("each node received %.2f pings a second, want about %.2f (%d peers each %s)", got, want, nodes-1, interval)
	}
	// The lost node's peers last heard it at most a beat before its loss,
	// and grant a failover only once it was silent for the lease and its
	// margin.
	if earliest := lease + config.MinLeaseMargin(lease) - interval; r.Failover < earliest {
		t.Errorf("a failover was granted %s after the node's loss: want no sooner than %s", r.Failover, earliest)
	}
	// While the lost node stays down, a publish does not wait for it
	// again: one wait for a new connection per outage (cluster.outages).
	if r.FailoverNext >= cluster.DefaultReconnectWait {
		t.Errorf("a publish while a node is down took %s: want less than the reconnect wait (%s), which only the outage's first call waits", r.FailoverNext, cluster.DefaultReconnectWait)
	}
	// A create reserves generation 1 with every node (a majority must
	// grant it).
	if got := r.CallsPerCreate["NodeAgent/Reserve"]; got < nodes {
		t.Errorf("a create asked %.1f nodes to reserve: want every one of the %d", got, nodes)
	}
	// It asks each node once, before it reserves: who it is and its
	// capacity (placement), with what it holds of the volume (an earlier
	// attempt's copy, and the promises the reservation starts from).
	if got := r.CallsPerCreate["NodeAgent/GetNode"]; got > nodes {
		t.Errorf("a create asked the nodes who they are %.1f times: want at most once each (%d)", got, nodes)
	}
	if got := r.CallsPerCreate["NodeAgent/GetVolume"]; got > 0 {
		t.Errorf("a create asked the nodes for the volume %.1f times: want none (its look at the copies tells)", got)
	}
	for what, d := range map[string]time.Duration{"publish": r.Publish, "move": r.Move, "full plan": r.FullPlan, "leases held": r.LeasesHeld, "next failover": r.FailoverNext} {
		if d <= 0 {
			t.Errorf("%s took %s: want a measured time", what, d)
		}
	}
	if r.HeapPerNode == 0 || r.CPUPerNode <= 0 {
		t.Errorf("heap %d B and CPU %s per node: want both measured", r.HeapPerNode, r.CPUPerNode)
	}
}

// TestScaleWitnesses runs the measurement on six nodes with three
// witnesses: each node pings the witnesses only (a witness is pinged by
// the five others each beat, another node by none), and a failover after
// a witness's loss is still granted, by the two left, no sooner than the
// lease and its margin allow.
func TestScaleWitnesses(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a lost node's lease and margin, about 22 s")
	}
	const nodes, witnesses, lease = 6, 3, 2 * time.Second
	r, err := Run(context.Background(), Config{Nodes: nodes, VolumesPerNode: 2, Latency: time.Millisecond, Beats: 4, Samples: 2, Parallel: 4, Lease: lease,
		Witnesses: witnesses, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(row(r))
	interval := lease / 4
	if want := float64(nodes-1) / interval.Seconds(); math.Abs(r.PingsPerWitnessSecond-want) > want/2 {
		t.Errorf("each witness received %.2f pings a second, want about %.2f (%d nodes each %s)", r.PingsPerWitnessSecond, want, nodes-1, interval)
	}
	if r.PingsPerOtherSecond > 0 {
		t.Errorf("a node that is not a witness received %.2f pings a second, want none", r.PingsPerOtherSecond)
	}
	if earliest := lease + config.MinLeaseMargin(lease) - interval; r.Failover < earliest {
		t.Errorf("a failover was granted %s after the node's loss: want no sooner than %s", r.Failover, earliest)
	}
	// A create reserves generation 1 with the witnesses and the node it
	// chose, not with every node.
	if got := r.CallsPerCreate["NodeAgent/Reserve"]; got > witnesses+1 {
		t.Errorf("a create asked %.1f nodes to reserve: want the %d witnesses and the chosen node at most", got, witnesses)
	}
	t.Logf("reservations: %.1f a create, %.1f a move", r.CallsPerCreate["NodeAgent/Reserve"], r.CallsPerMove["NodeAgent/Reserve"])
}

// TestScaleFigures prints the figures table of docs/architecture.md,
// "Scale": go test -run TestScaleFigures ./internal/testbed/scalesim
// -args -scale-nodes 3,10,30,100 (make scale).
func TestScaleFigures(t *testing.T) {
	if *sizes == "" {
		t.Skip("no -scale-nodes: make scale measures")
	}
	var rows []string
	for _, field := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n < 1 {
			t.Fatalf("-scale-nodes: %q is not a node count", field)
		}
		r, err := Run(context.Background(), Config{Nodes: n, VolumesPerNode: *volumes, Latency: 500 * time.Microsecond, Beats: *beats, Samples: 5, Parallel: 16, Witnesses: min(*wits, n), Dir: t.TempDir()})
		if err != nil {
			t.Fatalf("%d nodes: %v", n, err)
		}
		rows = append(rows, row(r))
		t.Log(rows[len(rows)-1])
	}
	fmt.Println(header)
	for _, r := range rows {
		fmt.Println(r)
	}
}

const header = "| nodes | volumes | create (median; all) | leases held after | calls a node receives per second, quiet | CPU per node | heap per node | publish | planned move | failover: first; next | full plan; from the book | calls the nodes receive per create; per move |\n|---|---|---|---|---|---|---|---|---|---|---|---|"

func row(r Result) string {
	var calls []string
	for method, rate := range r.CallsPerNodeSecond {
		if rate >= 0.005 {
			calls = append(calls, fmt.Sprintf("%s %.2f", method, rate))
		}
	}
	slices.Sort(calls)
	if r.Witnesses > 0 {
		calls = append(calls, fmt.Sprintf("(pings: %.2f a witness, %.2f another node)", r.PingsPerWitnessSecond, r.PingsPerOtherSecond))
	}
	return fmt.Sprintf("| %d | %d | %s; %s | %s | %s | %.1f ms/s | %.1f MiB | %s | %s | %s; %s | %s; %s | %s; %s |",
		r.Nodes, r.Volumes, round(r.CreateEach), round(r.Fill), round(r.LeasesHeld), strings.Join(calls, ", "),
		float64(r.CPUPerNode)/float64(time.Millisecond), float64(r.HeapPerNode)/(1<<20),
		round(r.Publish), round(r.Move), round(r.Failover), round(r.FailoverNext), round(r.FullPlan), round(r.BookPlan),
		callsSummary(r.CallsPerCreate), callsSummary(r.CallsPerMove))
}

// callsSummary is the total of calls per operation and its three most
// frequent methods: "312 (NodeAgent/Reserve 100, ...)".
func callsSummary(calls map[string]float64) string {
	total := 0.0
	methods := make([]string, 0, len(calls))
	for method, n := range calls {
		total += n
		methods = append(methods, method)
	}
	slices.SortFunc(methods, func(a, b string) int {
		if calls[a] != calls[b] {
			return cmp.Compare(calls[b], calls[a])
		}
		return strings.Compare(a, b)
	})
	var top []string
	for _, m := range methods[:min(3, len(methods))] {
		top = append(top, fmt.Sprintf("%s %.0f", m, calls[m]))
	}
	return fmt.Sprintf("%.0f (%s)", total, strings.Join(top, ", "))
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
