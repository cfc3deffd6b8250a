// Package faultsim is a deterministic fault-injection simulation of the
// driver (docs/simulation.md, "The simulation"), after FoundationDB's
// simulation testing and TigerBeetle's VOPR: the real controller (CSI
// controller, migration, placement) and several real node processes
// (agent, volume manager, replication, leases, CSI node service), each
// over its own fake pool, talk gRPC over an in-memory network that loses,
// duplicates and cuts messages and partitions links; processes crash at
// any call into their pool and start again; a CO moves allocations,
// retries and replays calls as Nomad does. A seed fixes every choice;
// after every step a checker asserts the invariants I1-I4 against the
// pools' and mount tables' real state.
package faultsim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/node/mount"
	"github.com/zfs-nomad/zfs-nomad/internal/node/zfs/zfsfake"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
)

// Config is one run.
type Config struct {
	Seed    uint64
	Steps   int
	Nodes   int
	Volumes int
	// Domains splits the nodes into this many replication domains, in
	// order (five nodes in two: n1-n3 and n4-n5). A volume moves only
	// within its domain; the leases and the failovers' majorities count
	// every node (docs/safety.md, "Why the lease and failover majorities
	// intersect").
	Domains int
	// Lease and LeaseMargin are the nodes' lease configuration, on the
	// simulation's clock: one step is one second.
	Lease, LeaseMargin time.Duration
	// MaxProcessDowntime bounds, in steps, how long a crashed zfs-node
	// process stays down before it runs again (Nomad restarts it). The
	// leases are safe only while it is below Lease+LeaseMargin
	// (docs/safety.md).
	MaxProcessDowntime int
	// Drift is the largest rate error of a node's clock, in percent: each
	// node's lease clock runs at its own rate within ±Drift of the
	// simulation's (the lease margin is there for it).
	Drift int
	// Skew is the largest offset of a node's wall clock (which names
	// replication snapshots and dates fences) from the simulation's: no
	// decision may compare two nodes' readings of it.
	Skew  time.Duration
	Rates Rates
	// ControllerCrashes lets the controller die in the middle of a publish.
	// It dies after k of its calls to the agents, and calls of one fan-out
	// race, so which k got through before it died can differ between two
	// runs of a seed: the one fault a replay may not repeat exactly.
	ControllerCrashes bool
	// Controllers is how many controller instances run (0: one). The CO
	// sends each call to any of them; the one that holds the work lease
	// runs the schedule and the pass over deletions.
	Controllers int
	// LyingPeers lets a node's certificate holder send another node forged
	// streams (liar.go). Off by default, so that a seed's other choices
	// stay what they were.
	LyingPeers bool
	// Dir holds the nodes' staging and target directories.
	Dir     string
	Verbose bool
	// Trace, when set, gets every line of the run's trace as it happens.
	Trace func(string)
	// NodePeers, when set, gives each node's peer list from the list of
	// every node's address: the explorer lists a node under two
	// addresses (explore_scenarios.go).
	NodePeers func(node string, all []string) []string
	// Aliases gives every node a second address (its name with a "b"),
	// as a host listed by name and by IP has, and lists about half the
	// nodes under both in each node's peers and two of them in the
	// controller's: the leases, reservations and the work lease must
	// count nodes, not addresses (docs/safety.md, "Nodes, not
	// addresses").
	// From rolls of their own, so that a seed's other choices stay.
	Aliases bool
	// ForcePromotions lets the operator run promote -force where its
	// guarantee holds (forcePromote): TestSimulationForced, and the
	// explorer's forced scenario.
	ForcePromotions bool
	// Witnesses, when set, names the nodes of the witness set every node
	// is configured with (docs/safety.md, "Witnesses"): the leases and a
	// generation's majorities count them only, and half the splits cut
	// off a majority of them that is a minority of all nodes (cutSide).
	Witnesses []string
	// SmallBuffers gives every connection gRPC's default 32 KiB buffers
	// instead of the agent's larger ones (agent.DialOptions): the
	// explorer starts a world per run, and clearing the large buffers of
	// its connections took half of a run's time.
	SmallBuffers bool
}

// Rates are the chances of the faults.
type Rates struct {
	Loss  float64 // per message: a request or its answer is lost
	Dup   float64 // per request: delivered twice
	Cut   float64 // per stream message: the stream breaks
	Crash float64 // per call into a pool during an operation: the process dies there
}

// DefaultConfig is what make test runs for each seed.
func DefaultConfig(seed uint64) Config {
	return Config{Seed: seed, Steps: 60, Nodes: 3, Volumes: 2, Domains: 1, Lease: 8 * time.Second, LeaseMargin: 4 * time.Second,
		MaxProcessDowntime: 6, Drift: 10, Skew: time.Hour, ControllerCrashes: true, Rates: Rates{Loss: 0.01, Dup: 0.01, Cut: 0.02, Crash: 0.003}}
}

// world is one run: the machines, the network, the controller, the CO.
type world struct {
	cfg      Config
	dice     *dice
	net      *network
	crashing atomic.Bool

	clockMu sync.Mutex
	clock   time.Time
	start   time.Time

	nodes []*simNode
	peers *listedPeers // the controller's peer list
	// splitAgain cuts the links of the running split again; it lasts
	// until step splitEnds, whatever other heals come (split).
	splitAgain func()
	splitEnds  int
	// clockSteps are the steps at which a node's wall clock steps: near
	// the lease's boundaries of the last split (split).
	clockSteps []int
	// ctls are the controller instances (Config.Controllers); forced,
	// when set, gets the CO's calls (a crash in the middle of one).
	ctls       []*simController
	forced     *simController
	lastHolder string // the instance that last held the work lease
	vols       []*simVolume
	snaps      []*simSnapshot // the CSI snapshots the CO holds
	// deletedSnaps: those DeleteSnapshot answered OK for (D1).
	deletedSnaps []*simSnapshot
	// snapshotsTaken and restores count CreateSnapshot and restore calls,
	// to name their objects.
	snapshotsTaken, restores int
	step                     int
	// stepNow is step, for goroutines of the system under test.
	stepNow atomic.Int64

	stats Stats
	// stalls are the stalling liars' streams (liar.go); done ends them.
	stalls sync.WaitGroup
	done   chan struct{}

	traceMu sync.Mutex
	trace   []string
	checker *checker
}

// Stats count what a run exercised, so that a run that tests nothing
// shows.
type Stats struct {
	Publishes     int // ControllerPublishVolume answered OK
	NewGeneration int // of which moved or failed the volume over
	Stages        int // NodeStage and NodePublish succeeded
	StaleRefused  int // a replayed claim was refused
	// AheadStages: stages of a claim granted ahead of a move's end
	// (after_generation) that succeeded, replays included.
	AheadStages int
	// MovesInBackground: publishes that answered while the volume's move
	// ran on in the background; GrantedAhead: publishes the controller
	// granted ahead of a move's end; PublishedElsewhere: publishes to
	// another node than a running move's target (Nomad placing the job
	// elsewhere, an operator's job run).
	MovesInBackground, GrantedAhead, PublishedElsewhere int
	Writes                                              int // a job's write succeeded
	ReadOnly                                            int // a job's write failed: its copy is read-only
	Pushes                                              int // an operator's push succeeded
	Crashes                                             int // processes crashed or lost power
	Deletes                                             int // DeleteVolume answered OK
	LiesRefused                                         int // a lying peer's stream was refused as it should be
	Stalls                                              int // a lying peer stalled a stream mid-receive
	Snapshots                                           int // CreateSnapshot answered OK
	// SnapshotDeletes, Restores, Expands: DeleteSnapshot, CreateVolume
	// from a snapshot and ControllerExpandVolume answered OK.
	SnapshotDeletes, Restores, Expands int
	SurplusRemoved                     int // copies a move demoted that the schedule removed
	// DeletedCopiesHidden: D1 checks made while a copy of the deleted
	// snapshot was still on some node.
	DeletedCopiesHidden int
	// SettledRestores: runs whose snapshots were listed once each and
	// restored from, every node up (S2).
	SettledRestores int
	// DeletedInFlight: snapshots deleted while a push's stream carrying
	// them was held, to land after the delete (deleteDuringPush).
	DeletedInFlight int
	// WorkLeaseHeld: steps some controller instance held the work lease
	// in; WorkLeaseHandovers: times another instance took it over.
	WorkLeaseHeld, WorkLeaseHandovers int
	// Promotions, ForcedPromotions, ReplicasRemoved: the operator's
	// zfs-controller promote, promote -force and remove-replica that
	// succeeded.
	Promotions, ForcedPromotions, ReplicasRemoved int
	// RollbacksRefused: rollbackLie's incrementals refused.
	RollbacksRefused int
	// ForgedNames: replicas a lying peer labelled with another volume's
	// name; NamedCommands: operator commands that named a volume by its
	// name (operatorNames).
	ForgedNames, NamedCommands int
}

func (s *Stats) Add(o Stats) {
	s.Publishes += o.Publishes
	s.NewGeneration += o.NewGeneration
	s.Stages += o.Stages
	s.StaleRefused += o.StaleRefused
	s.AheadStages += o.AheadStages
	s.MovesInBackground += o.MovesInBackground
	s.GrantedAhead += o.GrantedAhead
	s.PublishedElsewhere += o.PublishedElsewhere
	s.Writes += o.Writes
	s.ReadOnly += o.ReadOnly
	s.Pushes += o.Pushes
	s.Crashes += o.Crashes
	s.Deletes += o.Deletes
	s.LiesRefused += o.LiesRefused
	s.Stalls += o.Stalls
	s.Snapshots += o.Snapshots
	s.SnapshotDeletes += o.SnapshotDeletes
	s.Restores += o.Restores
	s.Expands += o.Expands
	s.SurplusRemoved += o.SurplusRemoved
	s.DeletedCopiesHidden += o.DeletedCopiesHidden
	s.SettledRestores += o.SettledRestores
	s.DeletedInFlight += o.DeletedInFlight
	s.WorkLeaseHeld += o.WorkLeaseHeld
	s.WorkLeaseHandovers += o.WorkLeaseHandovers
	s.Promotions += o.Promotions
	s.ForcedPromotions += o.ForcedPromotions
	s.ReplicasRemoved += o.ReplicasRemoved
	s.RollbacksRefused += o.RollbacksRefused
	s.ForgedNames += o.ForgedNames
	s.NamedCommands += o.NamedCommands
}

// Run runs one seed and returns the first invariant it broke, with the
// trace that led there.
func Run(cfg Config) (Stats, error) {
	w := newWorld(cfg)
	defer w.close()
	for w.step = 1; w.step <= cfg.Steps; w.step++ {
		w.stepNow.Store(int64(w.step))
		if err := w.runStep(); err != nil {
			return w.stats, &Failure{Seed: cfg.Seed, Step: w.step, Err: err, Trace: w.lastTrace(80), shape: shapeFlags(cfg)}
		}
	}
	if err := w.settle(); err != nil {
		return w.stats, &Failure{Seed: cfg.Seed, Step: w.step, Err: err, Trace: w.lastTrace(80), shape: shapeFlags(cfg)}
	}
	return w.stats, nil
}

// Failure is an invariant broken at a step of a seed.
type Failure struct {
	Seed  uint64
	Step  int
	Err   error
	Trace []string
	shape string // the flags that give a replay the run's shape
}

// shapeFlags are the flags a replay of cfg needs beyond -seed.
func shapeFlags(cfg Config) string {
	def, out := DefaultConfig(cfg.Seed), ""
	if cfg.Nodes != def.Nodes {
		out += fmt.Sprintf(" -nodes %d", cfg.Nodes)
	}
	if cfg.Volumes != def.Volumes {
		out += fmt.Sprintf(" -volumes %d", cfg.Volumes)
	}
	if cfg.Domains != def.Domains {
		out += fmt.Sprintf(" -domains %d", cfg.Domains)
	}
	if cfg.LyingPeers {
		out += " -lying-peers"
	}
	if cfg.Skew != def.Skew {
		out += fmt.Sprintf(" -skew %s", cfg.Skew)
	}
	if cfg.Controllers > 1 {
		out += fmt.Sprintf(" -controllers %d", cfg.Controllers)
	}
	if cfg.Aliases {
		out += " -aliases"
	}
	if cfg.ForcePromotions {
		out += " -force"
	}
	return out
}

func (f *Failure) Error() string {
	return fmt.Sprintf("seed %d, step %d: %v\n  trace (last %d lines):\n    %s\n  replay: go test ./internal/testbed/faultsim -run 'TestSimulation$' -seed %d%s -v",
		f.Seed, f.Step, f.Err, len(f.Trace), strings.Join(f.Trace, "\n    "), f.Seed, f.shape)
}

func newWorld(cfg Config) *world {
	w := &world{cfg: cfg, dice: newDice(cfg.Seed), clock: time.Unix(1_800_000_000, 0), done: make(chan struct{})}
	w.start = w.clock
	w.net = newNetwork(w.dice, rates{loss: cfg.Rates.Loss, dup: cfg.Rates.Dup, cut: cfg.Rates.Cut}, w.tracef, w.stepNow.Load)
	w.net.smallBuffers = cfg.SmallBuffers
	w.checker = newChecker(w)
	for i := 1; i <= cfg.Nodes; i++ {
		id := fmt.Sprintf("n%d", i)
		n := &simNode{id: id, w: w, mounts: mount.NewFake(), base: filepath.Join(cfg.Dir, id), domain: domainOf(i, cfg)}
		if cfg.Drift > 0 {
			n.rate = 1 + float64(w.dice.intn(2*cfg.Drift+1)-cfg.Drift)/100
		}
		if cfg.Skew > 0 {
			// From a roll of its own, so the seeds' other choices stay
			// as they were without skew.
			n.skew.Store(int64(time.Duration((2*w.dice.roll("skew/"+id, 0) - 1) * float64(cfg.Skew)).Truncate(time.Second)))
		}
		n.pool = zfsfake.New(poolSize, "tank")
		n.pool.GUIDSeed = guidSeed(cfg.Seed, id)
		if err := n.pool.CreateFilesystem(context.Background(), rootDataset, nil); err != nil {
			panic(err) // an empty fake always takes it
		}
		if err := os.MkdirAll(n.base, 0o750); err != nil {
			panic(err)
		}
		n.handoff = w.net.listen(id)
		w.nodes = append(w.nodes, n)
	}
	w.peers = &listedPeers{nodeAt: w.net.nodeAt, hidden: map[string]bool{}}
	for _, n := range w.nodes {
		w.peers.all = append(w.peers.all, n.addr())
	}
	if cfg.Aliases {
		w.addAliases()
	}
	for _, n := range w.nodes {
		n.start(context.Background())
	}
	for i := range max(cfg.Controllers, 1) {
		c := &simController{endpoint: controllerName(i)}
		w.net.setUp(c.endpoint, true)
		c.start(w)
		w.ctls = append(w.ctls, c)
	}
	for i := 0; i < cfg.Volumes; i++ {
		w.vols = append(w.vols, newSimVolume(fmt.Sprintf("vol%d", i)))
	}
	return w
}

// addAliases gives each node its second address (Config.Aliases). The
// nodes' peer lists name some nodes under it (simNode.config), and the
// controller's names two nodes under both: two is the fewest with which
// counting addresses makes a majority of a minority of five (two nodes,
// both listed twice, are four of seven addresses), so a controller that
// kept both answers of a node (cluster.oncePerNode) could reserve or
// hold the work lease on a minority. No more than two: the controller
// counts an address that never answered as a node of its own, so each
// alias of a node that is down makes its majorities harder (safe, but
// with about half the nodes aliased the five-node runs left no seed a
// snapshot deleted while a node was away).
func (w *world) addAliases() {
	for _, n := range w.nodes {
		w.net.alias(aliasOf(n.id), n.id)
	}
	first := int(w.dice.roll("alias/controller", 0) * float64(len(w.nodes)))
	second := (first + 1 + int(w.dice.roll("alias/controller", 1)*float64(len(w.nodes)-1))) % len(w.nodes)
	for _, i := range []int{first, second} {
		w.peers.all = append(w.peers.all, "passthrough:///"+addrOf(aliasOf(w.nodes[i].id)))
	}
}

// aliasOf is node's second name (Config.Aliases).
func aliasOf(node string) string { return node + "b" }

// domainOf names the replication domain of the i-th node (from 1).
func domainOf(i int, cfg Config) string {
	if cfg.Domains <= 1 {
		return config.DefaultDomain
	}
	return fmt.Sprintf("d%d", (i-1)*cfg.Domains/cfg.Nodes+1)
}

func guidSeed(seed uint64, node string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	return splitmix64(seed ^ h.Sum64())
}

func (w *world) close() {
	close(w.done)
	w.stalls.Wait()
	for _, c := range w.ctls {
		c.stop()
	}
	for _, n := range w.nodes {
		n.stop()
		_ = n.handoff.lis.Close()
	}
}

func (w *world) now() time.Time {
	w.clockMu.Lock()
	defer w.clockMu.Unlock()
	return w.clock
}

// nodeNow is the time on a node's clock, which runs at rate times the
// simulation's.
func (w *world) nodeNow(rate float64) time.Time {
	now := w.now()
	if rate == 0 {
		return now
	}
	return w.start.Add(time.Duration(float64(now.Sub(w.start)) * rate))
}

func (w *world) tick() {
	w.clockMu.Lock()
	defer w.clockMu.Unlock()
	w.clock = w.clock.Add(time.Second)
}

func (w *world) tracef(format string, args ...any) {
	line := fmt.Sprintf("[%3d] ", w.stepNow.Load()) + fmt.Sprintf(format, args...)
	// Under the lock, Trace too: goroutines of the system trace at once,
	// and Trace gets the lines one at a time, in the trace's order.
	w.traceMu.Lock()
	defer w.traceMu.Unlock()
	w.trace = append(w.trace, line)
	if w.cfg.Trace != nil {
		w.cfg.Trace(line)
	}
}

func (w *world) lastTrace(n int) []string {
	w.traceMu.Lock()
	defer w.traceMu.Unlock()
	if len(w.trace) > n {
		return append([]string(nil), w.trace[len(w.trace)-n:]...)
	}
	return append([]string(nil), w.trace...)
}

func (w *world) node(id string) *simNode {
	for _, n := range w.nodes {
		if n.id == id {
			return n
		}
	}
	return nil
}

// runStep advances the clock one second, does one thing (an operation of
// the CO or a fault), lets the processes beat and the jobs write, and
// checks the invariants.
func (w *world) runStep() error { return w.advance(w.pick) }

// advance is one step: the clock moves a second, nodes due start, choose
// (unless nil) picks the step's action, which runs, the invariants are
// checked, the processes beat, the jobs write, and the invariants are
// checked again.
func (w *world) advance(choose func() func()) error {
	w.tick()
	w.restartDue()
	if w.step == w.splitEnds && w.splitAgain != nil {
		w.splitAgain = nil
		w.heal()
	}
	if slices.Contains(w.clockSteps, w.step) {
		w.stepWallClock()
	}
	if choose != nil {
		act := choose()
		w.crashing.Store(true)
		act()
		w.crashing.Store(false)
	}
	w.reap()
	// What the action left holds until the nodes' next beats, which in
	// production come up to a ping interval (L/4) apart: a copy the
	// action made stale stays writable, and its job writes, until its
	// node's beat fences it. So the invariants hold here too, not only
	// once every node has beaten.
	if err := w.checker.check(); err != nil {
		return err
	}
	w.beat()
	w.reap()
	w.write()
	if err := w.askForWorkLease(); err != nil {
		return err
	}
	return w.checker.check()
}

// reap stops the processes that died during the step and sets when each
// starts again.
func (w *world) reap() {
	for _, n := range w.nodes {
		if n.inc != nil && !n.inc.isAlive() {
			n.stop()
			w.stats.Crashes++
			n.restartAt = w.step + 1 + w.dice.intn(w.cfg.MaxProcessDowntime)
			w.tracef("%s: process down until step %d", n.id, n.restartAt)
		}
	}
}

func (w *world) restartDue() {
	for _, n := range w.nodes {
		if n.inc == nil && n.restartAt <= w.step {
			w.returnEmptyHanded(n)
			n.start(context.Background())
		}
	}
}

// beat runs one heartbeat on every live node.
func (w *world) beat() {
	for _, n := range w.nodes {
		if n.inc == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		n.inc.heartbeat.Beat(ctx)
		cancel()
	}
}

// write lets every job write to the copy mounted on its node: a job keeps
// writing where its volume is mounted whatever the driver or the CO
// believe, so a copy mounted writable in two places is two writers.
func (w *world) write() {
	for _, n := range w.nodes {
		for _, ds := range n.mounts.Datasets() {
			token := fmt.Sprintf("%s/s%d", n.id, w.step)
			if err := n.pool.Write(ds, token); err == nil {
				w.checker.acked(ds, token)
				w.stats.Writes++
			} else if errors.Is(err, syscall.EROFS) {
				w.stats.ReadOnly++
			}
		}
	}
}
