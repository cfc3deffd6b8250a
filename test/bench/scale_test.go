package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/operator"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/scheduler"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/tlsconfig"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

var (
	scaleCounts = flag.String("scale-counts", "10,100,1000", "volumes per node BenchmarkScale measures at")
	scaleReps   = flag.Int("scale-reps", 5, "calls of each kind BenchmarkScale takes the median of")
	heavyReps   = flag.Int("scale-heavy-reps", 3, "calls of each kind whose answer grows with the volumes (listings, status) BenchmarkScale takes the median of")
)

// BenchmarkScale: with 10, 100 and 1000 volumes on every node
// of three, the median latency of each CSI call that concerns one volume,
// and of the operator's zfs-controller status (whose answer grows with the
// volumes), and of a schedule round, against raw zfs create, zfs destroy
// and zfs list -d1 of the same pool in the same run, and the processes'
// memory. The volumes besides the measured ones are made by zfs create with the driver's labels (in parallel: the
// driver's own CreateVolume would take minutes for a thousand), and the
// node processes restart after each fill, so they know them only from
// their pools; the first create after that restart (1stCreate, create
// and delete) waits for the nodes' first listing and is shown apart.
// The per-volume calls are measured first, the listings and status (each
// reads every node's index or every volume) after them, fewer times.
// Goal: every per-volume call at 1000 at most 1.2x its figure at 10.
func BenchmarkScale(b *testing.B) {
	c := guesttest.StartCluster(b, 3, guestcluster.Options{LogLevel: "info", ControllerArgs: []string{"-schedule-every", "0"}})
	ctx := context.Background()
	ctl, capability := controllerClient(b, c), mountCapability
	agents := operatorCluster(b, c)

	var table []string
	have := 0
	b.ResetTimer()
	for _, field := range strings.Split(*scaleCounts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(field))
		if err != nil || n < have {
			b.Fatalf("-scale-counts %q: counts must be numbers, growing", *scaleCounts)
		}
		b.StopTimer()
		filled := time.Now()
		logFrom := map[string]int{} // each node's log length at its restart
		for _, node := range c.Nodes {
			fillNode(b, node, have, n)
			fillPromises(b, node, c.Nodes, have, n)
			logFrom[node.ID] = len(readLog(node))
			if err := node.RestartWith(); err != nil {
				b.Fatal(err)
			}
		}
		waitForAgents(b, ctx, agents, len(c.Nodes))
		waitForIndexes(c, logFrom)
		have = n
		b.StartTimer()
		// Printed at once too: a benchmark's log comes only at its end,
		// and a long run cut short by its timeout would show nothing.
		fmt.Printf("BenchmarkScale: %d volumes per node filled in %.0f s\n", n, time.Since(filled).Seconds())
		row := scaleRow(b, ctx, c, agents, ctl, capability, n)
		table = append(table, row)
		b.Log(row)
		fmt.Printf("BenchmarkScale: %s\nBenchmarkScale: %s\n", scaleHeader, row)
	}
	b.StopTimer()
	b.Logf("median seconds per call, %d calls each (%d of the listings and status), on three nodes (raw: zfs create, zfs list -d1 on one pool):\n%s\n%s",
		*scaleReps, *heavyReps, scaleHeader, strings.Join(table, "\n"))
}

const scaleHeader = "volumes/node  raw-create raw-destroy raw-list  1stCreate Create   GetNode  GetCopy  Delete   Publish  Stage    GetCap   List100  ListAll  status   RoundFull  RoundBook  RoundCreate ctl-RSS-MiB node-RSS-MiB"

// fillNode makes volumes from..to-1 of a node with zfs create, eight at
// once, labelled as the driver labels a primary, and checks they are
// there.
func fillNode(b *testing.B, n *guestcluster.Node, from, to int) {
	if to <= from {
		return
	}
	var lines strings.Builder
	for i := from; i < to; i++ {
		id := fillID(n, i)
		// Every tenth asks for a replica: the schedule's rounds have a
		// tenth of the volumes due (no replica exists yet).
		params := map[string]string{}
		if i%10 == 0 {
			params[contract.ParamReplicas], params[contract.ParamReplicationInterval] = "1", "1h"
		}
		fmt.Fprintf(&lines, "-o mountpoint=legacy -o %s=%s -o %s=fill-%s-%d -o %s=%s -o %s=1 -o %s=1 -o %s=%s %s/%s\n",
			copyrecord.PropVolumeID, id, copyrecord.PropName, n.ID, i, copyrecord.PropRole, contract.RolePrimary, copyrecord.PropGeneration, copyrecord.PropHistoryFrom,
			copyrecord.PropParameters, copyrecord.EncodeParameters(params), n.RootDataset, id)
	}
	list := filepath.Join(b.TempDir(), "fill")
	if err := os.WriteFile(list, []byte(lines.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	// Eight at a time (the guest's busybox xargs has no -L): creates that
	// wait for the same pool sync share it.
	sh(b, fmt.Sprintf(`i=0; while read -r args; do zfs create $args & i=$((i+1)); [ $((i %% 8)) -eq 0 ] && wait; done < %s; wait`, list))
	got := strings.Count(sh(b, "zfs list -H -d1 -o name "+n.RootDataset), "\n") - 1
	if got < to {
		b.Fatalf("filling node %s: %d volumes, want %d", n.ID, got, to)
	}
}

func fillID(n *guestcluster.Node, i int) string {
	return fmt.Sprintf("vol-%020x", uint64(n.Index)<<32|uint64(i))
}

// fillPromises records on node what the driver's creates of the volumes
// from..to-1 of every node would have left there: each create reserves
// generation 1 on every node that answers (a majority is needed), so a
// node keeps a promise record for every volume of the cluster, in the
// shards of copyrecord.PromiseShard. One zfs set per shard.
func fillPromises(b *testing.B, node *guestcluster.Node, all []*guestcluster.Node, from, to int) {
	if to <= from {
		return
	}
	// Every shard exists, as on a node that has been running a while: the
	// first record of a shard makes it, a create that would otherwise
	// count only in the first row.
	shards := map[string][]string{}
	if from == 0 {
		for i := range 256 {
			shards[copyrecord.PromiseShard(node.RootDataset, fmt.Sprintf("vol-%020x", i))] = nil
		}
	}
	for _, holder := range all {
		for i := from; i < to; i++ {
			id := fillID(holder, i)
			shard := copyrecord.PromiseShard(node.RootDataset, id)
			shards[shard] = append(shards[shard], fmt.Sprintf("%s%s='1 %s'", copyrecord.PropPromisePrefix, id, holder.ID))
		}
	}
	var script strings.Builder
	script.WriteString("set -e\n")
	for shard, records := range shards {
		fmt.Fprintf(&script, "zfs list %[1]s >/dev/null 2>&1 || zfs create -p -o canmount=off -o mountpoint=none %[1]s\n", shard)
		if len(records) > 0 {
			fmt.Fprintf(&script, "zfs set %s %s\n", strings.Join(records, " "), shard)
		}
	}
	// A file, not sh -c: at 1000 volumes the script outgrows one argument.
	file := filepath.Join(b.TempDir(), "promises")
	if err := os.WriteFile(file, []byte(script.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	sh(b, "sh "+file)
}

// scaleRow measures one row of the table with n volumes on every node.
func scaleRow(b *testing.B, ctx context.Context, c *guestcluster.Cluster, agents *cluster.Cluster, ctl csi.ControllerClient, capability *csi.VolumeCapability, n int) string {
	n1 := c.Nodes[0]
	nodeConn, err := grpc.NewClient(n1.CSIEndpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer nodeConn.Close()
	node := csi.NewNodeClient(nodeConn)
	// The nodes just restarted: the first create waits for their first
	// listing of every volume, which fills their indexes (docs/volumes.md,
	// "Counting and listing"); the rows' calls come after it.
	firstCreate := seconds(func() {
		resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("scale-%d-first", n),
			VolumeCapabilities: []*csi.VolumeCapability{capability}, Parameters: map[string]string{"node": n1.ID}})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
			b.Fatal(err)
		}
	})
	// Two of CreateVolume's parts, asked of n1's agent directly: the
	// placement's GetNode (every node's count and free space) and the
	// majority's GetCopy (each node's copy and promise record).
	nodes, _, err := agents.Nodes(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var a1 cluster.NodeAgent
	for _, nd := range nodes {
		if nd.Info.NodeID == n1.ID {
			a1, _ = nd.Agent.(cluster.NodeAgent)
		}
	}
	if a1 == nil {
		b.Fatalf("node %s's agent does not answer", n1.ID)
	}
	var createdAt, deletedAt []string // each create's and delete's time, and when it began: to lay beside the nodes' listings
	var rawCreate, rawDestroy, rawList, create, getNode, getCopy, del, publish, stage, getCap, list100, listAll, status []float64
	for i := range *scaleReps {
		raw := fmt.Sprintf("%s/raw-%d-%d", n1.RootDataset, n, i)
		rawCreate = append(rawCreate, seconds(func() { sh(b, "zfs create "+raw) }))
		rawDestroy = append(rawDestroy, seconds(func() { sh(b, "zfs destroy "+raw) }))

		name := fmt.Sprintf("scale-%d-%d", n, i)
		getNode = append(getNode, seconds(func() {
			if _, err := a1.GetNode(ctx, agentclient.GetNodeOptions{}); err != nil {
				b.Fatal(err)
			}
		}))
		getCopy = append(getCopy, seconds(func() {
			if _, err := a1.GetCopy(ctx, contract.VolumeIDForName(name)); err != nil {
				b.Fatal(err)
			}
		}))
		var id string
		began := time.Now()
		create = append(create, seconds(func() {
			resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{capability},
				Parameters: map[string]string{"node": n1.ID}})
			if err != nil {
				b.Fatal(err)
			}
			id = resp.GetVolume().GetVolumeId()
		}))
		createdAt = append(createdAt, fmt.Sprintf("%.3f s at %s", create[len(create)-1], began.Format("15:04:05")))
		var publishContext map[string]string
		publish = append(publish, seconds(func() {
			resp, err := ctl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: n1.ID, VolumeCapability: capability})
			if err != nil {
				b.Fatal(err)
			}
			publishContext = resp.GetPublishContext()
		}))
		staging := filepath.Join(n1.Dir, "staging-"+name)
		stage = append(stage, seconds(func() {
			if _, err := node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				VolumeCapability: capability, PublishContext: publishContext}); err != nil {
				b.Fatal(err)
			}
		}))
		if _, err := node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			b.Fatal(err)
		}
		if _, err := ctl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: n1.ID}); err != nil {
			b.Fatal(err)
		}
		getCap = append(getCap, seconds(func() {
			if _, err := ctl.GetCapacity(ctx, &csi.GetCapacityRequest{}); err != nil {
				b.Fatal(err)
			}
		}))
		began = time.Now()
		del = append(del, seconds(func() {
			if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
				b.Fatal(err)
			}
		}))
		deletedAt = append(deletedAt, fmt.Sprintf("%.3f s at %s", del[len(del)-1], began.Format("15:04:05")))
	}
	// The calls whose answer grows with the volumes (each reads every
	// node's index or every volume) come after the per-volume calls, not
	// between them: at 1000 volumes a status reads 3000 volumes for two
	// minutes, and the call after it met a cold cache.
	for range *heavyReps {
		rawList = append(rawList, seconds(func() { sh(b, "zfs list -H -d1 -o name,zfs-nomad:role "+n1.RootDataset+" >/dev/null") }))
		list100 = append(list100, seconds(func() {
			if _, err := ctl.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 100}); err != nil {
				b.Fatal(err)
			}
		}))
		listAll = append(listAll, seconds(func() {
			token := ""
			for {
				resp, err := ctl.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 100, StartingToken: token})
				if err != nil {
					b.Fatal(err)
				}
				if token = resp.GetNextToken(); token == "" {
					return
				}
			}
		}))
		status = append(status, seconds(func() { operatorStatus(b, c) }))
	}
	fmt.Printf("BenchmarkScale: %d volumes per node, the creates: %s\n", n, strings.Join(createdAt, ", "))
	fmt.Printf("BenchmarkScale: %d volumes per node, the deletes: %s\n", n, strings.Join(deletedAt, ", "))
	printListings(c, n)
	full, fromBook, afterCreate := scheduleRound(b, ctx, agents, ctl, capability, n1.ID, len(c.Nodes), n)
	var nodeRSS float64
	for _, nd := range c.Nodes {
		nodeRSS = max(nodeRSS, rssMiB(nd.Process.Pid()))
	}
	return fmt.Sprintf("%12d  %9.3f %10.3f %9.3f %9.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f %10.3f %10.3f %10.3f %11.1f %12.1f",
		n, median(rawCreate), median(rawDestroy), median(rawList), firstCreate, median(create), median(getNode), median(getCopy), median(del), median(publish), median(stage),
		median(getCap), median(list100), median(listAll), median(status), full, fromBook, afterCreate, rssMiB(c.Controller.Pid()), nodeRSS)
}

func seconds(f func()) float64 { return timed(f).Seconds() }

// printListings prints the nodes' log lines about the listings of their
// indexes (at info when slow): a call that meets one competes with it
// for the guest, and the row's figures are read beside them.
func printListings(c *guestcluster.Cluster, n int) {
	for _, node := range c.Nodes {
		data, err := os.ReadFile(node.Process.Log)
		if err != nil {
			fmt.Printf("BenchmarkScale: reading %s's log: %v\n", node.ID, err)
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, "for their index") {
				fmt.Printf("BenchmarkScale: %d volumes per node, %s: %s\n", n, node.ID, line)
			}
		}
	}
}

// operatorCluster connects to the nodes' agents as the operator's
// commands do, with the operator's certificate, and the controller's
// default agent_timeout (30 s).
func operatorCluster(b *testing.B, c *guestcluster.Cluster) *cluster.Cluster {
	material, err := tlsconfig.Load(c.Operator)
	if err != nil {
		b.Fatal(err)
	}
	addrs := c.AgentAddresses()
	log := hclog.New(&hclog.LoggerOptions{Name: "bench", Level: hclog.Warn, Output: os.Stderr})
	cl := cluster.New(peers.Static(addrs), 30*time.Second, log, grpc.WithTransportCredentials(material.ClientCredentials()))
	b.Cleanup(cl.Close)
	return cl
}

// waitForAgents waits until every node's agent answers: a node restarted
// with a thousand volumes finishes its start (the recovery's listing)
// before it serves, and a call meanwhile finds it unreachable.
func waitForAgents(b *testing.B, ctx context.Context, cl *cluster.Cluster, want int) {
	began := time.Now()
	for {
		nodes, unreachable, err := cl.Nodes(ctx)
		if err == nil && len(nodes) == want && len(unreachable) == 0 {
			fmt.Printf("BenchmarkScale: every agent answers %.0f s after the restarts\n", time.Since(began).Seconds())
			return
		}
		if time.Since(began) > 5*time.Minute {
			b.Fatalf("the agents do not all answer 5 min after their restart: %d of %d, unreachable %v, %v", len(nodes), want, unreachable, err)
		}
		time.Sleep(time.Second)
	}
}

// waitForIndexes waits until every node, since its restart (its log
// from logFrom on), has logged the listing that fills its index of CSI
// snapshots, the longer of its two start-up listings (the primaries' is
// started with it): the row then measures the calls of a node that is
// up, not of one still listing its whole pool beside them (BenchmarkScale
// on 2026-11-26 found its 1000-volume row measured during the last
// node's: Create 1.41x, Delete 1.55x). A node logs its first listings
// since its start at info. It waits at most listingWait; the time it
// took is printed.
func waitForIndexes(c *guestcluster.Cluster, logFrom map[string]int) {
	const listingWait = 10 * time.Minute
	began := time.Now()
	for _, node := range c.Nodes {
		for !strings.Contains(readLog(node)[logFrom[node.ID]:], "listed the node's CSI snapshots for their index") {
			if time.Since(began) > listingWait {
				fmt.Printf("BenchmarkScale: %s logged no listing of its CSI snapshots in %v; measuring now\n", node.ID, listingWait)
				return
			}
			time.Sleep(time.Second)
		}
	}
	fmt.Printf("BenchmarkScale: every node's indexes filled %.0f s after the agents answered\n", time.Since(began).Seconds())
}

// readLog returns a node's log so far ("" when it cannot be read).
func readLog(node *guestcluster.Node) string {
	data, _ := os.ReadFile(node.Process.Log)
	return string(data)
}

// scheduleRound plans the replication schedule's rounds as the controller
// does and returns the seconds of a full plan (what the first round after
// the controller's start does) and the median of a round planned from its
// book (the rounds while no node's primaries change). A plan starts no
// push; the pushes are the rounds' work in proportion to what is due, a
// tenth of the volumes here. It fails unless each plan finds every due
// volume.
//
// afterCreate is a round after a create on one node: it asks that node
// what it holds again and takes the others' from the book.
func scheduleRound(b *testing.B, ctx context.Context, cl *cluster.Cluster, ctl csi.ControllerClient, capability *csi.VolumeCapability, node string, nodes, perNode int) (full, fromBook, afterCreate float64) {
	s := scheduler.New(cl, 1, hclog.New(&hclog.LoggerOptions{Name: "schedule", Level: hclog.Warn, Output: os.Stderr}))
	due := nodes * ((perNode + 9) / 10)
	plan := func() {
		pushes, err := s.Plan(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(pushes) != due {
			b.Fatalf("a round with %d volumes per node planned %d pushes, want %d (a tenth of the volumes ask for a replica)", perNode, len(pushes), due)
		}
	}
	full = seconds(plan)
	var rounds, created []float64
	for i := range *scaleReps {
		rounds = append(rounds, seconds(plan))
		resp, err := ctl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("round-%d-%d", perNode, i),
			VolumeCapabilities: []*csi.VolumeCapability{capability}, Parameters: map[string]string{"node": node}})
		if err != nil {
			b.Fatal(err)
		}
		created = append(created, seconds(plan))
		if _, err := ctl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
			b.Fatal(err)
		}
		plan() // the delete changed the node again: the next book round starts from here
	}
	return full, median(rounds), median(created)
}

// operatorStatus runs zfs-controller status as the operator does, with
// the operator's certificate. It exits ExitReplicasBehind: every tenth
// volume of the fill asks for a replica that no node holds yet.
func operatorStatus(b *testing.B, c *guestcluster.Cluster) {
	peers := c.AgentAddresses()
	args := []string{"status", "-peers", strings.Join(peers, ","), "-tls-ca", c.Operator.CA, "-tls-cert", c.Operator.Cert, "-tls-key", c.Operator.Key}
	out, err := guestcluster.Run(filepath.Join(guesttest.BinDir(b), "zfs-controller"), args...)
	if exit := (*exec.ExitError)(nil); errors.As(err, &exit) && exit.ExitCode() == operator.ExitReplicasBehind {
		return
	}
	if err != nil {
		b.Fatalf("zfs-controller status: %v\n%s", err, out)
	}
}

// rssMiB reads a process's resident memory.
func rssMiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.Fields(rest)[0], 64)
			return kb / 1024
		}
	}
	return 0
}
