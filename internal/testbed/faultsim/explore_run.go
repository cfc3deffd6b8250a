package faultsim

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/csiserver"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/peers"
)

// explRun is one run of a scenario: the simulation's world of nodes (real
// node processes over fake pools, the in-memory network, the checker),
// the controller instances over gated agents, the actors, the scheduler.
type explRun struct {
	sc   *explScenario
	w    *world
	s    *explSched
	vol  *simVolume
	ctls map[string]*explController
	// alias maps a second address of a node to the node.
	alias map[string]string
	// primary is the node the setup created the volume on; others the
	// rest, by ID.
	primary string
	others  []string

	mu         sync.Mutex
	milestones map[string]*explMilestone
	notes      []explNote
	actors     sync.WaitGroup
	running    int // actors not finished
	log        hclog.Logger
}

// explNote is an actor's line in the trace, after step at.
type explNote struct {
	at   int
	line string
}

// explMilestone is an actor's step other actors wait for.
type explMilestone struct {
	done  chan struct{}
	ok    bool
	clock explClock
}

// explController is one controller instance as zfs-controller wires it
// (its cluster, migrator and CSI controller), over gated agents.
type explController struct {
	name string
	cl   *cluster.Cluster
	mig  *migration.Migrator
	csi  *csiserver.Controller

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// explLease is the nodes' lease in the explorer, and its margin: a tick
// (tickNow) moves the world's clock a second, a quarter of the lease and
// the heartbeat's interval; the margin covers a ping interval and a beat,
// as the simulation's does (docs/simulation.md, "What the simulation runs").
const (
	explLease  = 4 * time.Second
	explMargin = 2 * time.Second
)

// newExplRun builds the world of a run and runs the scenario's setup,
// ungated.
func newExplRun(sc *explScenario, dir string) (*explRun, error) {
	cfg := Config{Seed: 1, Nodes: sc.nodes, Volumes: 1, Domains: 1, Lease: explLease, LeaseMargin: explMargin, MaxProcessDowntime: 1, Dir: dir,
		NodePeers: sc.nodePeers, Witnesses: sc.witnesses, SmallBuffers: true}
	x := &explRun{sc: sc, ctls: map[string]*explController{}, alias: map[string]string{}, milestones: map[string]*explMilestone{},
		log: hclog.NewNullLogger()}
	x.w = newWorld(cfg)
	x.vol = x.w.vols[0]
	x.s = newExplSched(x.nodeDown)
	for a, n := range sc.aliases {
		x.addAlias(a, n)
	}
	if err := x.setup(); err != nil {
		x.close()
		return nil, err
	}
	if sc.setup != nil {
		if err := sc.setup(x); err != nil {
			x.close()
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	return x, nil
}

// addAlias lists node under a second address too: the network takes it
// to the node's listener.
func (x *explRun) addAlias(alias, node string) {
	x.alias[alias] = node
	x.w.net.alias(alias, node)
}

// aliasAddr is the address under which alias reaches its node.
func aliasAddr(alias string) string { return "passthrough:///" + addrOf(alias) }

// nodeOf names the node an address reaches.
func (x *explRun) nodeOf(addr string) string {
	ep := endpointOf(addr)
	if n, ok := x.alias[ep]; ok {
		return n
	}
	return ep
}

// nodeDown says why a node's process does not answer ("" if it does).
func (x *explRun) nodeDown(node string) string {
	if n := x.w.node(node); n == nil || n.inc == nil || !n.inc.isAlive() {
		return "node " + node + " is down"
	}
	return ""
}

// setup creates the volume with the simulation's own controller, pushes a
// replica to each node the scenario wants one on, and lets every node
// beat once, so that the leases hold and the copies are confirmed.
func (x *explRun) setup() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c0 := x.w.ctls[0]
	_, err := c0.ctl.CreateVolume(ctx, &csispec.CreateVolumeRequest{Name: x.vol.name, VolumeCapabilities: []*csispec.VolumeCapability{mountCapability},
		Parameters: map[string]string{contract.ParamReplicas: "0", contract.ParamFailover: cmp.Or(x.sc.failover, contract.FailoverManual)}})
	if err != nil {
		return fmt.Errorf("creating the volume: %w", err)
	}
	x.vol.created = true
	x.w.checker.created(x.vol.id)
	p, _, err := c0.mig.Current(ctx, x.vol.id)
	if err != nil {
		return fmt.Errorf("finding the volume's primary: %w", err)
	}
	x.primary = p.Info.NodeID
	for _, n := range x.w.nodes {
		if n.id != x.primary {
			x.others = append(x.others, n.id)
		}
	}
	if x.sc.primary != "" && x.primary != x.sc.primary {
		return fmt.Errorf("the volume was created on %s; the scenario needs it on %s", x.primary, x.sc.primary)
	}
	for _, to := range x.sc.replicaOn {
		target := x.w.node(to)
		if _, err := p.Agent.Replicate(ctx, x.vol.id, agentclient.Target{Addr: target.addr(), NodeID: to}, "explorer setup", nil); err != nil {
			return fmt.Errorf("pushing a replica to %s: %w", to, err)
		}
	}
	x.tickNow()
	return nil
}

// tickNow advances the clock by one heartbeat interval and lets every
// node that runs beat; it says which nodes hold their lease.
func (x *explRun) tickNow() string {
	x.w.tick()
	x.w.beat()
	var held []string
	for _, n := range x.w.nodes {
		if n.inc != nil && n.inc.volumes.Fences().Held() {
			held = append(held, n.id)
		}
	}
	return "leases held: " + strings.Join(held, ",")
}

// controller starts instance name over gated agents, listing peers.
func (x *explRun) controller(name string, peerAddrs []string) *explController {
	c := &explController{name: name, conns: map[string]*grpc.ClientConn{}}
	connect := func(addr string) (cluster.NodeAgent, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		conn, ok := c.conns[addr]
		if !ok {
			var err error
			conn, err = grpc.NewClient(addr, x.w.net.directDialOptions(name)...)
			if err != nil {
				return nil, err
			}
			c.conns[addr] = conn
		}
		return &gatedAgent{x: x, ctl: name, node: x.nodeOf(addr), addr: addr, inner: agentclient.ForNode(conn, "")}, nil
	}
	// An hour per call: no call of the run waits in real time.
	c.cl = cluster.NewWithAgents(peers.Static(peerAddrs), connect, time.Hour, x.log)
	c.mig = migration.New(c.cl, x.log)
	// The move runs in the publish that starts it, not in a background
	// job that the publish waits for in real time (CatchUpWait): the
	// final step is the same code either way (Migrator.move).
	c.mig.CatchUpFresh = -1
	c.mig.SetClock(x.w.now)
	c.csi = csiserver.New(c.cl, c.mig, "most-free", x.log)
	x.ctls[name] = c
	return c
}

// allPeers is every node's address: the controller's usual peer list.
func (x *explRun) allPeers() []string {
	var out []string
	for _, n := range x.w.nodes {
		out = append(out, n.addr())
	}
	return out
}

func (c *explController) stop() {
	c.mig.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
}

// note adds an actor's line to the trace.
func (x *explRun) note(format string, args ...any) {
	x.s.mu.Lock()
	at := len(x.s.trace)
	x.s.mu.Unlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	x.notes = append(x.notes, explNote{at: at, line: fmt.Sprintf(format, args...)})
}

// reach marks a milestone of actor: its step ended, well or not.
func (x *explRun) reach(actor, name string, ok bool) {
	x.s.mu.Lock()
	clock := x.s.clocks[actor].clone()
	x.s.mu.Unlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	m := x.milestone(name)
	select {
	case <-m.done:
		return // the run ended
	default:
	}
	m.clock, m.ok = clock, ok
	close(m.done)
}

// await waits for a milestone and makes actor know what it followed; it
// reports whether the step went well.
func (x *explRun) await(actor, name string) bool {
	x.mu.Lock()
	m := x.milestone(name)
	x.mu.Unlock()
	<-m.done
	x.mu.Lock()
	defer x.mu.Unlock()
	x.s.mu.Lock()
	known := x.s.clocks[actor]
	known.join(m.clock)
	x.s.clocks[actor] = known
	x.s.mu.Unlock()
	return m.ok
}

func (x *explRun) milestone(name string) *explMilestone {
	m, ok := x.milestones[name]
	if !ok {
		m = &explMilestone{done: make(chan struct{})}
		x.milestones[name] = m
	}
	return m
}

// explActor is one actor: its steps run one after the other, each
// through gated calls.
type explActor struct {
	name  string
	steps []explStepFn
}

// start runs every actor in its own goroutine.
func (x *explRun) start(actors []explActor) {
	x.running = len(actors)
	for _, a := range actors {
		x.actors.Add(1)
		go func() {
			defer x.actors.Done()
			defer func() {
				x.mu.Lock()
				x.running--
				x.mu.Unlock()
			}()
			for _, step := range a.steps {
				step(context.Background(), x)
			}
		}()
	}
}

func (x *explRun) finished() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.running == 0
}

// publish is the CO's ControllerPublishVolume of the volume on node,
// sent to instance ctl: the call carries what the CO knew, its answer
// what the instance knew.
func (x *explRun) publish(ctx context.Context, actor, ctl, node string) (map[string]string, error) {
	c := x.ctls[ctl]
	x.s.join(ctl, actor)
	resp, err := c.csi.ControllerPublishVolume(ctx, &csispec.ControllerPublishVolumeRequest{VolumeId: x.vol.id, NodeId: node, VolumeCapability: mountCapability})
	x.s.join(actor, ctl)
	if why := x.crashed(ctl); why != "" {
		resp, err = nil, errLost(why) // a dead process's answer never arrives
	}
	x.note("%s: ControllerPublishVolume on %s via %s: %v %s", actor, node, ctl, resp.GetPublishContext(), errText(err))
	return resp.GetPublishContext(), err
}

// flush is the flush that ControllerUnpublishVolume from node starts,
// answered by instance ctl, run to its end in the actor's goroutine
// (migration.Migrator.FlushNow).
func (x *explRun) flush(ctx context.Context, actor, ctl, node string) {
	c := x.ctls[ctl]
	x.s.join(ctl, actor)
	c.mig.FlushNow(ctx, x.vol.id, node)
	x.s.join(actor, ctl)
	x.note("%s: the flush after ControllerUnpublishVolume from %s via %s ended", actor, node, ctl)
}

// crashed says why instance ctl is dead ("" if it runs).
func (x *explRun) crashed(ctl string) string {
	x.s.mu.Lock()
	defer x.s.mu.Unlock()
	if x.s.dead[ctl] {
		return "controller instance " + ctl + " has crashed"
	}
	return ""
}

// stage is the CO's NodeStageVolume and NodePublishVolume on node with a
// publish context: one gated call on the node.
func (x *explRun) stage(ctx context.Context, actor, node string, pubctx map[string]string) error {
	n := x.w.node(node)
	err := x.s.call(explSpec{actor: actor, node: node, method: "Stage", args: pubctx[contract.PublishContextGeneration]}, func() (string, error) {
		inc := n.inc
		if inc == nil {
			return "", errLost("node " + node + " is down")
		}
		_, err := inc.node.NodeStageVolume(ctx, &csispec.NodeStageVolumeRequest{VolumeId: x.vol.id, StagingTargetPath: n.stagingPath(x.vol.id),
			VolumeCapability: mountCapability, PublishContext: pubctx})
		if err == nil {
			_, err = inc.node.NodePublishVolume(ctx, &csispec.NodePublishVolumeRequest{VolumeId: x.vol.id, StagingTargetPath: n.stagingPath(x.vol.id),
				TargetPath: n.targetPath(x.vol.id), VolumeCapability: mountCapability, PublishContext: pubctx})
		}
		if err == nil {
			x.w.checker.staged(x.vol.id, node)
			return "staged writable", nil
		}
		return "", err
	})
	x.note("%s: NodeStage+NodePublish on %s with %v: %s", actor, node, pubctx, errText(err))
	return err
}

// promote is the operator's zfs-controller promote (-force) of the
// volume's replica on node, through instance ctl.
func (x *explRun) promote(ctx context.Context, actor, ctl, node string, force bool) error {
	c := x.ctls[ctl]
	x.s.join(ctl, actor)
	cp, err := c.mig.Promote(ctx, x.vol.id, node, force)
	x.s.join(actor, ctl)
	if why := x.crashed(ctl); why != "" {
		cp, err = agentclient.Copy{}, errLost(why)
	}
	x.note("%s: promote -force=%v on %s via %s: generation %d %s", actor, force, node, ctl, cp.Generation, errText(err))
	return err
}

// env runs one action of the environment (a tick of the clock, a cut, a
// heal) as a gated call: it touches every node.
func (x *explRun) env(method, args string, act func() string) {
	_ = x.s.call(explSpec{actor: "env", node: "*", method: method, args: args}, func() (string, error) { return act(), nil })
}

// isolate cuts node off from every other node and every actor; heal
// undoes it.
func (x *explRun) isolate(node string) string {
	x.s.cutLink("*", node, "node "+node+" is cut off")
	x.partition(node, true)
	return node + " cut off from every node and actor"
}

func (x *explRun) heal(node string) string {
	x.s.heal(node)
	x.partition(node, false)
	return node + " reachable again"
}

// partition cuts (or heals) the links between node and every other
// node, both ways, under each of their addresses.
func (x *explRun) partition(node string, cut bool) {
	for _, m := range x.w.nodes {
		if m.id != node {
			x.cutNodes(node, m.id, cut)
		}
	}
}

// split cuts the nodes of side off from the other nodes, the controller
// instances and the CO; side keeps its own links.
func (x *explRun) split(side ...string) {
	for _, n := range side {
		x.s.cutLink("*", n, "node "+n+" is on the other side of a split")
	}
	for _, a := range x.w.nodes {
		for _, b := range x.w.nodes {
			if slices.Contains(side, a.id) && !slices.Contains(side, b.id) {
				x.cutNodes(a.id, b.id, true)
			}
		}
	}
}

// cutNodes cuts (or heals) the link between two nodes, both ways, under
// each of their addresses.
func (x *explRun) cutNodes(a, b string, cut bool) {
	for _, p := range x.names(a) {
		for _, q := range x.names(b) {
			x.w.net.partition(p, q, cut)
			x.w.net.partition(q, p, cut)
		}
	}
}

// names are a node's endpoints: its own and its aliases.
func (x *explRun) names(n string) []string {
	out := []string{n}
	for a, m := range x.alias {
		if m == n {
			out = append(out, a)
		}
	}
	return out
}

// powerOff takes a node down for the rest of the run: its process, its
// mounts and its jobs.
func (x *explRun) powerOff(node string) {
	n := x.w.node(node)
	n.stop()
	n.mounts.Reset()
}

// stageNow stages the volume on node ungated (a setup's job), with the
// generation its primary has there.
func (x *explRun) stageNow(node string) error {
	n := x.w.node(node)
	gen := x.w.checker.user(n, rootDataset+"/"+x.vol.id, copyrecord.PropGeneration)
	pubctx := map[string]string{contract.PublishContextGeneration: gen}
	ctx := context.Background()
	_, err := n.inc.node.NodeStageVolume(ctx, &csispec.NodeStageVolumeRequest{VolumeId: x.vol.id, StagingTargetPath: n.stagingPath(x.vol.id),
		VolumeCapability: mountCapability, PublishContext: pubctx})
	if err == nil {
		_, err = n.inc.node.NodePublishVolume(ctx, &csispec.NodePublishVolumeRequest{VolumeId: x.vol.id, StagingTargetPath: n.stagingPath(x.vol.id),
			TargetPath: n.targetPath(x.vol.id), VolumeCapability: mountCapability, PublishContext: pubctx})
	}
	return err
}

// close ends the run: every call still waiting is lost, the actors and
// the instances wind down, the world stops.
func (x *explRun) close() {
	x.s.abandon()
	x.mu.Lock()
	for _, m := range x.milestones {
		select {
		case <-m.done:
		default:
			close(m.done) // not reached: whoever waits gives up
		}
	}
	x.mu.Unlock()
	done := make(chan struct{})
	go func() {
		x.actors.Wait()
		for _, c := range x.ctls {
			c.stop()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(effectTimeout):
		panic("explorer: a run's actors did not end:\n" + goroutines())
	}
	x.w.close()
}

// traceLines renders steps (indexes into the run's trace) with the
// actors' notes between them.
func (x *explRun) traceLines(steps []int) []string {
	x.mu.Lock()
	notes := slices.Clone(x.notes)
	x.mu.Unlock()
	var out []string
	ni := 0
	for _, i := range steps {
		for ni < len(notes) && notes[ni].at <= i {
			out = append(out, "      "+notes[ni].line)
			ni++
		}
		st := x.s.trace[i]
		line := fmt.Sprintf("%3d. %s", i+1, st.ev.label)
		if st.ev.kind == explEffect && st.result != "" {
			line += " -> " + st.result
		}
		out = append(out, line)
	}
	for ; ni < len(notes); ni++ {
		if len(steps) == 0 || notes[ni].at <= steps[len(steps)-1]+1 {
			out = append(out, "      "+notes[ni].line)
		}
	}
	return out
}
