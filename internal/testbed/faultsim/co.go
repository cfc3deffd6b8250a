package faultsim

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	csispec "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/agentclient"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/operator"
	"github.com/zfs-nomad/zfs-nomad/internal/node/copyrecord"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// simVolume is one volume as the CO knows it.
type simVolume struct {
	name, id string
	created  bool
	alloc    string // the node the CO runs the volume's job on ("": none)
	// lostFrom is the node whose lost job the CO is placing elsewhere
	// until a placement succeeds ("": none): Nomad retries it.
	lostFrom string
	context  map[string]string // the publish context the job was staged with
	// claims are every (node, publish context) the volume was ever
	// staged with: the CO may replay any of them (a restored allocation,
	// a delayed call).
	claims []claim
}

type claim struct {
	node    string
	context map[string]string
}

// lastGeneration is the generation of the newest publish the volume got
// ("" before the first).
func (v *simVolume) lastGeneration() string {
	for i := len(v.claims) - 1; i >= 0; i-- {
		if g := v.claims[i].context[contract.PublishContextGeneration]; g != "" {
			return g
		}
	}
	return ""
}

func newSimVolume(name string) *simVolume {
	return &simVolume{name: name, id: contract.VolumeIDForName(name)}
}

var mountCapability = &csispec.VolumeCapability{
	AccessType: &csispec.VolumeCapability_Mount{Mount: &csispec.VolumeCapability_MountVolume{}},
	AccessMode: &csispec.VolumeCapability_AccessMode{Mode: csispec.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// pick chooses the step's action.
func (w *world) pick() func() {
	type choice struct {
		weight int
		act    func()
	}
	v := w.vols[w.dice.intn(len(w.vols))]
	n := w.nodes[w.dice.intn(len(w.nodes))]
	m := w.nodes[w.dice.intn(len(w.nodes))]
	choices := []choice{
		{20, func() { w.schedule(v, n) }},
		{8, func() { w.stopJob(v) }},
		{10, func() { w.backup(v, n, m) }},
		{6, func() { w.scheduleRound() }},
		{25, func() { w.replay(v) }},
		{4, func() { w.cut(n, m) }},
		{6, func() { w.split(v) }},
		{6, func() { w.heal() }},
		{10, func() { w.rescheduleLost() }},
		{3, func() { w.crashProcess(n) }},
		{8, func() { w.powerLoss(n) }},
		{map[bool]int{true: 4}[w.cfg.ControllerCrashes], func() { w.crashController(v, n) }},
		{2, func() { w.delete(v) }},
		{5, func() { w.snapshot(v) }},
		{3, func() { w.deleteSnapshot() }},
		{3, func() { w.deleteDuringPush(v, n, m) }},
		{3, func() { w.finishDeletions() }},
		{3, func() { w.checkDeletedStayDeleted() }},
		{2, func() { w.restore() }},
		{3, func() { w.expand(v) }},
		{3, func() { w.promote(v, n) }},
		{map[bool]int{true: 5}[w.cfg.ForcePromotions], func() { w.forcePromote(v) }},
		{2, func() { w.removeReplica(v, n) }},
		{15, func() {}}, // time passes
	}
	if !v.created {
		choices = append(choices, choice{30, func() { w.create(v) }})
	}
	if w.cfg.LyingPeers {
		choices = append(choices, choice{10, func() { w.lie(v, n, m) }}, choice{5, func() { w.stall(v, n, m) }})
	}
	total := 0
	for _, c := range choices {
		total += c.weight
	}
	r := w.dice.intn(total)
	for _, c := range choices {
		if r < c.weight {
			return c.act
		}
		r -= c.weight
	}
	return func() {}
}

func opContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 20*time.Second)
}

func (w *world) create(v *simVolume) {
	ctx, cancel := opContext()
	defer cancel()
	// Some ask for no replica: a move leaves a surplus copy of those,
	// which the schedule removes.
	replicas := []string{"0", "1", "1", "2"}[w.dice.intn(4)]
	_, err := w.co().ctl.CreateVolume(ctx, &csispec.CreateVolumeRequest{Name: v.name, VolumeCapabilities: []*csispec.VolumeCapability{mountCapability},
		Parameters: map[string]string{contract.ParamReplicas: replicas, contract.ParamFailover: contract.FailoverAuto}})
	w.tracef("co: CreateVolume %s replicas=%s: %v", v.name, replicas, errText(err))
	if err == nil {
		v.created = true
		w.checker.created(v.id)
	}
}

// reaches says whether the CO can run calls on node n: its process runs
// and the node talks to the servers both ways.
func (w *world) reaches(n *simNode) bool {
	return n.inc != nil && w.net.deliverable(controllerEndpoint, n.id) == "" && w.net.deliverable(n.id, controllerEndpoint) == ""
}

func (n *simNode) stagingPath(id string) string { return filepath.Join(n.base, "staging", id) }
func (n *simNode) targetPath(id string) string  { return filepath.Join(n.base, "alloc", id, "mnt") }

// stopJob stops the volume's job as Nomad does: unpublish and unstage on
// its node if the node answers; a lost node's job is abandoned, still
// running there.
func (w *world) stopJob(v *simVolume) {
	if v.alloc == "" {
		return
	}
	n := w.node(v.alloc)
	if !w.reaches(n) {
		w.tracef("co: node %s lost: job of %s abandoned there", n.id, v.name)
		v.alloc = ""
		return
	}
	ctx, cancel := opContext()
	defer cancel()
	_, err := n.inc.node.NodeUnpublishVolume(ctx, &csispec.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: n.targetPath(v.id)})
	if err == nil {
		_, err = n.inc.node.NodeUnstageVolume(ctx, &csispec.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: n.stagingPath(v.id)})
	}
	w.tracef("co: stop job of %s on %s: %v", v.name, n.id, errText(err))
	if err == nil {
		v.alloc = ""
		_, err = w.co().ctl.ControllerUnpublishVolume(ctx, &csispec.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: n.id})
		w.tracef("co: ControllerUnpublishVolume %s from %s: %v", v.name, n.id, errText(err))
	}
}

// schedule places the volume's job on node n: the old job stops first
// (or is abandoned on a lost node), then ControllerPublishVolume,
// NodeStageVolume and NodePublishVolume. A job already on n is restored:
// its stage and publish are called again, as Nomad's client does.
func (w *world) schedule(v *simVolume, n *simNode) {
	if !v.created {
		return
	}
	if v.alloc != "" && v.alloc != n.id {
		w.stopJob(v)
		if v.alloc != "" {
			return
		}
	}
	if v.alloc == n.id {
		w.stage(v, claim{node: n.id, context: v.context})
		return
	}
	if !w.reaches(n) {
		return
	}
	ctx, cancel := opContext()
	defer cancel()
	if target, moving := w.moveRunning(v.id); moving && target != n.id {
		w.stats.PublishedElsewhere++
		w.tracef("co: publishes %s to %s while its move to %s runs", v.name, n.id, target)
	}
	resp, err := w.co().ctl.ControllerPublishVolume(ctx, &csispec.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: n.id, VolumeCapability: mountCapability})
	w.tracef("co: ControllerPublishVolume %s to %s: %v %v", v.name, n.id, resp.GetPublishContext(), errText(err))
	if err != nil {
		if _, moving := w.moveRunning(v.id); moving {
			w.stats.MovesInBackground++
		}
		return // Nomad retries later: a later step places the job again
	}
	if resp.GetPublishContext()[contract.PublishContextAfterGeneration] != "" {
		w.stats.GrantedAhead++
	}
	w.stats.Publishes++
	c := claim{node: n.id, context: resp.GetPublishContext()}
	if before := v.lastGeneration(); before != "" && before != c.context[contract.PublishContextGeneration] {
		w.stats.NewGeneration++
		// The same publish granted ahead of the move or failover that
		// made the new generation (the controller grants it while its
		// background move runs): replays of it try the node's "newer
		// than the source" rule against every later change.
		ahead := claim{node: n.id, context: map[string]string{contract.PublishContextAfterGeneration: before}}
		v.claims = append(v.claims, ahead)
		if w.dice.intn(2) == 0 {
			c = ahead
		}
	}
	if c.context[contract.PublishContextGeneration] != "" {
		v.claims = append(v.claims, c)
	}
	if w.stage(v, c) {
		v.alloc, v.context, v.lostFrom = n.id, c.context, ""
	}
}

// stage stages and publishes a claim on its node; true when both
// succeeded.
func (w *world) stage(v *simVolume, c claim) bool {
	n := w.node(c.node)
	if !w.reaches(n) {
		return false
	}
	ctx, cancel := opContext()
	defer cancel()
	_, err := n.inc.node.NodeStageVolume(ctx, &csispec.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: n.stagingPath(v.id),
		VolumeCapability: mountCapability, PublishContext: c.context})
	if err == nil {
		_, err = n.inc.node.NodePublishVolume(ctx, &csispec.NodePublishVolumeRequest{VolumeId: v.id, StagingTargetPath: n.stagingPath(v.id),
			TargetPath: n.targetPath(v.id), VolumeCapability: mountCapability, PublishContext: c.context})
	}
	w.tracef("co: NodeStage+NodePublish %s on %s with %v: %v", v.name, n.id, c.context, errText(err))
	if err == nil {
		w.stats.Stages++
		if c.context[contract.PublishContextAfterGeneration] != "" {
			w.stats.AheadStages++
		}
		w.checker.staged(v.id, n.id)
	}
	return err == nil
}

// rescheduleLost places a job whose node the CO lost on another node, as
// Nomad reschedules the allocations of a node that missed its heartbeats:
// the old one is abandoned there, still running, and the volume is
// published to a node the CO reaches in the same replication domain (the
// volume's accessible topology), again at later steps until a placement
// succeeds. It picks one of the volumes whose job runs on a lost node or
// waits to be placed again.
func (w *world) rescheduleLost() {
	var lost []*simVolume
	for _, v := range w.vols {
		if v.alloc != "" && !w.reaches(w.node(v.alloc)) || v.alloc == "" && v.lostFrom != "" && v.created {
			lost = append(lost, v)
		}
	}
	if len(lost) == 0 {
		return
	}
	v := lost[w.dice.intn(len(lost))]
	if v.alloc != "" {
		v.lostFrom = v.alloc
	}
	var targets []*simNode
	for _, n := range w.nodes {
		if n.id != v.lostFrom && n.domain == w.node(v.lostFrom).domain && w.reaches(n) {
			targets = append(targets, n)
		}
	}
	if len(targets) == 0 {
		return
	}
	n := targets[w.dice.intn(len(targets))]
	if w.dice.intn(3) == 0 {
		// A manual failover: the operator promotes the copy there first,
		// and forces a replica where a majority is lost and the
		// operator's guarantee holds.
		if !w.promote(v, n) {
			w.forcePromote(v)
		}
	}
	w.tracef("co: node %s lost: places the job of %s on %s", v.lostFrom, v.name, n.id)
	w.schedule(v, n)
}

// replay stages an old claim again: a restored allocation, or a call
// delayed in the network.
func (w *world) replay(v *simVolume) {
	if len(v.claims) == 0 {
		return
	}
	c := v.claims[w.dice.intn(len(v.claims))]
	w.tracef("co: replays the claim of %s on %s with %v", v.name, c.node, c.context)
	if !w.stage(v, c) {
		w.stats.StaleRefused++
	}
}

// backup is the operator's push of a volume from one node to another
// (zfs-controller backup); it fails on a node without the primary.
func (w *world) backup(v *simVolume, from, to *simNode) bool {
	if !v.created || from == to {
		return false
	}
	ctx, cancel := opContext()
	defer cancel()
	nodes, _, err := w.co().cl.Nodes(ctx)
	if err != nil {
		return false
	}
	for _, node := range nodes {
		if node.Info.NodeID == from.id {
			last, err := node.Agent.Replicate(ctx, v.id, agentclient.Target{Addr: to.addr(), NodeID: to.id}, "simulation", nil)
			w.tracef("co: backup %s %s->%s: %s %v", v.name, from.id, to.id, last.Kind, errText(err))
			if err == nil {
				w.stats.Pushes++
			}
			return err == nil
		}
	}
	return false
}

// promote is the operator's zfs-controller promote of the volume's copy
// on n, without -force, at any moment: the controller promotes only what
// a failover would (docs/safety.md, "Generations"), so no moment may
// break an invariant. forcePromote runs -force.
func (w *world) promote(v *simVolume, n *simNode) bool {
	if !v.created {
		return false
	}
	id, ok := w.operatorNames(v)
	if !ok {
		return false
	}
	ctx, cancel := opContext()
	defer cancel()
	cp, err := w.co().mig.Promote(ctx, id, n.id, false)
	w.tracef("operator: promote %s on %s: generation %d %v", v.name, n.id, cp.Generation, errText(err))
	if err == nil {
		w.stats.Promotions++
	}
	return err == nil
}

// forcePromote is the operator's zfs-controller promote -force of a
// replica of the volume on a node that answers, run only where the
// operator's guarantee holds (docs/install.md, "What the cluster must
// guarantee", 5): the simulation knows every node's state, as the operator
// is trusted to. Every node the
// controller cannot reach has no mount of the volume (its allocations
// are stopped) and holds and promised no generation of it above what
// the nodes that answer know (nothing newer). A forced generation may
// later be given again by a majority that never heard of it, which the
// controller reports as a conflict: the checker exempts it from "given
// once" (checker.generationsGrow), and from nothing else.
func (w *world) forcePromote(v *simVolume) {
	if !v.created || !w.cfg.ForcePromotions {
		return
	}
	fs := rootDataset + "/" + v.id
	var known, silentNewest uint64
	var silent []string
	var replicas []*simNode // the answering nodes' replicas: what an operator forces
	for _, m := range w.nodes {
		newest := w.newestKnown(m, v.id)
		if w.reaches(m) && m.inc.isAlive() { // a process that died this step is not reaped yet
			known = max(known, newest)
			if role, _, err := w.checker.label(m, fs); err == nil && role == contract.RoleReplica {
				replicas = append(replicas, m)
			}
			continue
		}
		if m.mounts.Mounted(fs) {
			return // the operator has not stopped its allocation
		}
		silent = append(silent, m.id)
		silentNewest = max(silentNewest, newest)
	}
	if len(silent) == 0 || len(replicas) == 0 || silentNewest > known {
		return
	}
	n := replicas[w.dice.intn(len(replicas))]
	// The guarantee is checked on the nodes as they are now: none dies
	// during the call, or the operator would have to stop its jobs too.
	crashing := w.crashing.Swap(false)
	defer w.crashing.Store(crashing)
	ctx, cancel := opContext()
	defer cancel()
	cp, err := w.co().mig.Promote(ctx, v.id, n.id, true)
	w.tracef("operator: promote -force %s on %s (silent: %v): generation %d %v", v.name, n.id, silent, cp.Generation, errText(err))
	if err != nil {
		return
	}
	w.stats.ForcedPromotions++
	if slices.Contains(silent, v.alloc) {
		v.lostFrom, v.alloc = v.alloc, "" // stopped by the operator; Nomad places it again
	}
	for _, id := range silent {
		w.declareLost(w.node(id), v)
	}
}

// declareLost is the rest of the operator's part of a promote -force
// (docs/install.md, "What the cluster must guarantee", 5): a node the force
// declared lost comes back only empty-handed. One that is only cut off
// is powered off now; before its process starts again, its copy of the
// volume is set aside (returnEmptyHanded). Were it to come back with
// its copy while the forced node is down, it and the others the force
// declared lost could be a majority that never heard of the forced
// generation, and their older copy would be staged.
func (w *world) declareLost(n *simNode, v *simVolume) {
	if n.inc != nil && n.inc.isAlive() {
		w.tracef("operator: powers %s off: declared lost by the promote -force of %s", n.id, v.name)
		w.powerLoss(n)
	}
	n.lost = append(n.lost, v.id)
}

// returnEmptyHanded sets aside, before n's process starts again, its
// copies of the volumes a promote -force declared it lost for, as the
// operator does (zfs rename <root>/<id> <root>/<id>-aside-...): renamed,
// they are no copy the driver stages or counts, and whatever writes they
// hold stay for the operator.
func (w *world) returnEmptyHanded(n *simNode) {
	n.calls.Lock() // no call of the last incarnation is still running
	defer n.calls.Unlock()
	ctx, cancel := opContext()
	defer cancel()
	for _, id := range n.lost {
		for _, name := range n.pool.Names() {
			if got, ok := copyOf(name); !ok || got != id || strings.Contains(name, "@") || strings.Contains(name, "-aside-") {
				continue
			}
			aside := copyrecord.AsideName(name, w.now())
			err := n.pool.SetProperties(ctx, name, copyrecord.SetAsideLabels(w.now()))
			if err == nil {
				err = n.pool.Rename(ctx, name, aside)
			}
			if err != nil {
				w.checker.late(fmt.Errorf("sim: the operator's setting aside of %s on %s failed: %w", name, n.id, err))
				continue
			}
			w.tracef("operator: %s comes back empty-handed: %s set aside as %s", n.id, name, aside)
		}
	}
	n.lost = nil
}

// operatorNames is how the operator names v to a command: by its ID, or
// half the time by its name, which the CLI resolves among the copies'
// name labels (operator.ResolveVolume). A label is a peer's word (a
// lying peer labels replicas of other volumes with v's name: lies), so a
// name must resolve to v or to nothing: to another volume, the command
// would act on that one. ok is false when the name resolved to nothing.
func (w *world) operatorNames(v *simVolume) (id string, ok bool) {
	// A roll of its own, not the seed's stream: the shapes' other draws
	// stay as they were.
	if w.dice.roll("names/"+v.id, uint64(w.step)) < 0.5 {
		return v.id, true
	}
	w.stats.NamedCommands++
	ctx, cancel := opContext()
	defer cancel()
	id, err := operator.ResolveVolume(ctx, w.co().cl, v.name, io.Discard)
	if err != nil {
		w.tracef("operator: the name %s resolves to nothing: %v", v.name, errText(err))
		return "", false
	}
	if id != v.id {
		w.checker.late(fmt.Errorf("the operator's name %s resolved to volume %s, not to %s", v.name, id, v.id))
	}
	return id, true
}

// newestKnown is the highest generation of volume id that node n holds
// a copy at or promised, read from its pool as the oracle does.
func (w *world) newestKnown(n *simNode, id string) uint64 {
	var newest uint64
	if _, gen, err := w.checker.label(n, rootDataset+"/"+id); err == nil {
		newest = gen
	}
	if p, ok := w.promise(n, id); ok {
		newest = max(newest, p.Generation)
	}
	return newest
}

// removeReplica is the operator's zfs-controller remove-replica of the
// volume's copy on n, without -force, at any moment: it refuses while no
// reachable node holds the primary, and the node deletes only a replica.
func (w *world) removeReplica(v *simVolume, n *simNode) {
	if !v.created {
		return
	}
	id, ok := w.operatorNames(v)
	if !ok {
		return
	}
	ctx, cancel := opContext()
	defer cancel()
	err := operator.RemoveReplica(ctx, w.co().cl, id, n.id, false, io.Discard)
	w.tracef("operator: remove-replica %s on %s: %v", v.name, n.id, errText(err))
	if err == nil {
		w.stats.ReplicasRemoved++
	}
}

// scheduleRound runs one round of the replication schedule, in the
// controller instance that holds the work lease (none: no round), and
// waits for its pushes.
func (w *world) scheduleRound() {
	ctx, cancel := opContext()
	defer cancel()
	for _, c := range w.holders() {
		removed := c.sched.SurplusRemoved()
		pushes := c.sched.Round(ctx)
		c.sched.Wait()
		w.stats.SurplusRemoved += int(c.sched.SurplusRemoved() - removed)
		for _, p := range pushes {
			w.tracef("%s: scheduled push of %s %s->%s (%s)", c.endpoint, p.VolumeID, p.Source.Info.NodeID, p.Target.Info.NodeID, p.Reason)
		}
		for _, n := range w.nodes {
			if err := w.checker.bookAgrees(c.sched, n); err != nil {
				w.checker.late(err)
			}
		}
	}
}

func (w *world) delete(v *simVolume) {
	if !v.created {
		return
	}
	w.stopJob(v)
	if v.alloc != "" {
		return
	}
	ctx, cancel := opContext()
	defer cancel()
	w.checker.deleting(v.id)
	_, err := w.co().ctl.DeleteVolume(ctx, &csispec.DeleteVolumeRequest{VolumeId: v.id})
	w.tracef("co: DeleteVolume %s: %v", v.name, errText(err))
	if err == nil {
		v.created, v.claims, v.context, v.lostFrom = false, nil, nil, ""
		w.stats.Deletes++
		w.checker.deleted(v.id)
	}
}

// cut partitions the link between two nodes, or between a node and the
// controller, one way or both; or lets connections through one way only.
func (w *world) cut(a, b *simNode) {
	from, to := a.id, b.id
	if a == b {
		to = controllerEndpoint
	}
	if w.dice.chance(0.5) {
		from, to = to, from
	}
	if w.dice.chance(0.25) {
		w.net.blockDial(from, to)
		w.tracef("net: %s cannot connect to %s (%s's connections to it work both ways)", from, to, to)
		return
	}
	both := w.dice.chance(0.6)
	w.net.partition(from, to, true)
	if both {
		w.net.partition(to, from, true)
	}
	w.tracef("net: cut %s->%s (both ways: %v)", from, to, both)
}

func (w *world) heal() {
	w.net.healAll()
	w.peers.showAll()
	if w.step < w.splitEnds && w.splitAgain != nil {
		w.splitAgain() // a split lasts its time; only the other cuts heal
	}
	w.tracef("net: healed")
}

// crashProcess kills a node's zfs-node process between two calls; the
// kernel keeps its mounts and the jobs keep writing.
func (w *world) crashProcess(n *simNode) {
	if n.inc == nil {
		return
	}
	w.tracef("%s: process killed", n.id)
	n.inc.die()
}

// powerLoss takes a whole node down: its process, its mounts and its
// jobs; its pool stays, and it comes back after a while.
func (w *world) powerLoss(n *simNode) {
	if n.inc != nil {
		n.stop()
	}
	n.mounts.Reset()
	w.stats.Crashes++
	n.restartAt = w.step + 1 + w.dice.intn(30)
	w.tracef("%s: power lost, back at step %d", n.id, n.restartAt)
}

// crashController lets a controller instance die after a few of its
// calls to the agents during one publish, then starts it again.
func (w *world) crashController(v *simVolume, n *simNode) {
	c := w.co()
	calls := w.dice.intn(8)
	w.tracef("%s: dies after %d agent calls", c.endpoint, calls)
	w.net.crashAfter(c.endpoint, calls)
	w.forced = c
	w.schedule(v, n)
	w.forced = nil
	c.stop() // before its calls go through again
	w.net.crashAfter(c.endpoint, -1)
	c.start(w)
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return s.Code().String() + ": " + s.Message()
	}
	return err.Error()
}
