package scalesim

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// waitForLeases waits until every node holds its lease: a majority of
// its peers answered it.
func (c *simCluster) waitForLeases(ctx context.Context, r *Result) error {
	lease := c.lease()
	deadline := time.Now().Add(2 * lease)
	for {
		held := 0
		for _, n := range c.nodes {
			if n.parts.Monitor.Held(n.id) {
				held++
			}
		}
		if held == len(c.nodes) {
			r.LeasesHeld = time.Since(c.started)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d nodes hold their lease %s after the start: want all", held, len(c.nodes), 2*lease)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// A volume is one the fill created, on the node it was created on.
type volume struct {
	id   string
	node string
	seq  int // the order the fill asked for it in
}

// fill creates VolumesPerNode volumes on each node through the
// controller's CreateVolume, Parallel at a time, each with one replica
// wanted (which the plans count; no push runs) and failover auto.
func (c *simCluster) fill(ctx context.Context, r *Result) ([]volume, error) {
	type job struct {
		name, node string
		seq        int
	}
	jobs := make(chan job)
	var (
		mu    sync.Mutex
		vols  []volume
		each  []time.Duration
		first error
	)
	var wg sync.WaitGroup
	for range max(c.cfg.Parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				began := time.Now()
				resp, err := c.ctl.CreateVolume(ctx, &csispec.CreateVolumeRequest{
					Name:               j.name,
					CapacityRange:      &csispec.CapacityRange{RequiredBytes: 1 << 20},
					VolumeCapabilities: []*csispec.VolumeCapability{mountCapability},
					Parameters:         map[string]string{contract.ParamNode: j.node, contract.ParamReplicas: "1", contract.ParamFailover: contract.FailoverAuto},
				})
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("CreateVolume %s on %s: %w", j.name, j.node, err)
				}
				if err == nil {
					vols = append(vols, volume{id: resp.GetVolume().GetVolumeId(), node: j.node, seq: j.seq})
					each = append(each, time.Since(began))
				}
				mu.Unlock()
			}
		}()
	}
	began := time.Now()
	seq := 0
	for v := range c.cfg.VolumesPerNode {
		for _, n := range c.nodes {
			jobs <- job{name: fmt.Sprintf("%s-vol%d", n.id, v), node: n.id, seq: seq}
			seq++
		}
	}
	close(jobs)
	wg.Wait()
	// In the order asked, not the order the creates ended: the samples
	// the moves take, and those the failover takes from the first node
	// after them, must not depend on which create finished first.
	slices.SortFunc(vols, func(a, b volume) int { return a.seq - b.seq })
	r.Fill, r.CreateEach, r.Volumes = time.Since(began), median(each), len(vols)
	return vols, first
}

// quiet measures the idle cluster over Beats heartbeat intervals: the
// calls each node receives, and the process's CPU and heap.
func (c *simCluster) quiet(r *Result) {
	window := c.lease() / 4 * time.Duration(max(c.cfg.Beats, 1))
	before := c.calls()
	pingsBefore := c.pingsByNode()
	cpu := cpuTime()
	time.Sleep(window)
	r.CPUPerNode = (cpuTime() - cpu) / time.Duration(len(c.nodes)) * time.Second / window
	r.CallsPerNodeSecond = map[string]float64{}
	for method, count := range c.calls() {
		r.CallsPerNodeSecond[method] = float64(count-before[method]) / window.Seconds() / float64(len(c.nodes))
	}
	if w := c.cfg.Witnesses; w > 0 {
		var toWitnesses, toOthers uint64
		for i, count := range c.pingsByNode() {
			if i < w {
				toWitnesses += count - pingsBefore[i]
			} else {
				toOthers += count - pingsBefore[i]
			}
		}
		r.Witnesses = w
		r.PingsPerWitnessSecond = float64(toWitnesses) / window.Seconds() / float64(w)
		r.PingsPerOtherSecond = float64(toOthers) / window.Seconds() / float64(max(len(c.nodes)-w, 1))
	}
	// Twice: what a sync.Pool holds (gRPC pools its message buffers) is
	// freed only by the second collection after it was put there.
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	r.HeapPerNode = m.HeapAlloc / uint64(len(c.nodes))
}

// pingsByNode is the pings each node received so far, in node order.
func (c *simCluster) pingsByNode() []uint64 {
	out := make([]uint64, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.calls.snapshot()["Peers/Ping"]
	}
	return out
}

// publishes times ControllerPublishVolume of Samples volumes to the
// nodes that hold them.
func (c *simCluster) publishes(ctx context.Context, vols []volume) (time.Duration, error) {
	var times []time.Duration
	for _, v := range spread(vols, c.cfg.Samples) {
		began := time.Now()
		if _, err := c.publish(ctx, v.id, v.node); err != nil {
			return 0, fmt.Errorf("ControllerPublishVolume %s to %s, the node that holds it: %w", v.id, v.node, err)
		}
		times = append(times, time.Since(began))
		if err := c.unpublish(ctx, v.id, v.node); err != nil {
			return 0, err
		}
	}
	return median(times), nil
}

// moves times planned moves of Samples volumes, each to the next node:
// ControllerPublishVolume to it, again every 100 ms while the move runs
// (the driver's time, not the CO's retry schedule), until it succeeds.
func (c *simCluster) moves(ctx context.Context, vols []volume) (time.Duration, error) {
	var times []time.Duration
	for _, v := range vols {
		target := c.nextNode(v.node)
		began := time.Now()
		if err := c.publishUntil(ctx, v.id, target, began.Add(time.Minute)); err != nil {
			return 0, fmt.Errorf("moving %s from %s to %s: %w", v.id, v.node, target, err)
		}
		times = append(times, time.Since(began))
		if err := c.unpublish(ctx, v.id, target); err != nil {
			return 0, err
		}
	}
	return median(times), nil
}

// publishUntil publishes the volume on node every 100 ms until it
// succeeds, as a CO retries a claim, or until deadline.
func (c *simCluster) publishUntil(ctx context.Context, volumeID, node string, deadline time.Time) error {
	for {
		_, err := c.publish(ctx, volumeID, node)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still refused at the deadline: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// plans times the schedule's first plan, which asks every node for what
// it holds, and the next, which its book answers.
func (c *simCluster) plans(ctx context.Context, r *Result) error {
	began := time.Now()
	if _, err := c.sched.Plan(ctx); err != nil {
		return fmt.Errorf("the schedule's full plan: %w", err)
	}
	r.FullPlan = time.Since(began)
	began = time.Now()
	if _, err := c.sched.Plan(ctx); err != nil {
		return fmt.Errorf("the schedule's plan from its book: %w", err)
	}
	r.BookPlan = time.Since(began)
	return nil
}

// failover pushes a replica of Samples volumes of the first node (none
// of them moved) to the second, stops the first node's process, and
// publishes each volume on the second until it succeeds: the first waits
// for the lease and its margin to run out.
func (c *simCluster) failover(ctx context.Context, vols, moved []volume, r *Result) error {
	lost, target := c.nodes[0], c.nodes[1]
	var mine []volume
	for _, v := range slices.Backward(vols) {
		if v.node == lost.id && !slices.Contains(moved, v) && len(mine) < max(c.cfg.Samples, 1) {
			mine = append(mine, v)
		}
	}
	if err := c.replicate(ctx, lost, target, mine); err != nil {
		return err
	}
	lost.stop()
	lostAt := time.Now()
	deadline := lostAt.Add(3 * (c.lease() + config.MinLeaseMargin(c.lease())))
	var next []time.Duration
	for i, v := range mine {
		began := time.Now()
		if err := c.publishUntil(ctx, v.id, target.id, deadline); err != nil {
			return fmt.Errorf("failing %s over from the lost %s to %s: %w", v.id, lost.id, target.id, err)
		}
		if i == 0 {
			r.Failover = time.Since(lostAt)
		} else {
			next = append(next, time.Since(began))
		}
	}
	r.FailoverNext = median(next)
	return nil
}

// replicate pushes each volume's replica from one node to another, as
// the schedule would.
func (c *simCluster) replicate(ctx context.Context, from, to *simNode, vols []volume) error {
	nodes, _, err := c.cl.Nodes(ctx)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(nodes, func(n cluster.Node) bool { return n.Info.NodeID == from.id })
	if i < 0 {
		return fmt.Errorf("node %s did not answer", from.id)
	}
	for _, v := range vols {
		if _, err := nodes[i].Agent.Replicate(ctx, v.id, agentclient.Target{Addr: to.addr(), NodeID: to.id}, "scale", nil); err != nil {
			return fmt.Errorf("pushing a replica of %s from %s to %s: %w", v.id, from.id, to.id, err)
		}
	}
	return nil
}
