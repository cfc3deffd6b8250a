package faultsim

import (
	"context"
	"fmt"
	"sort"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/contract"
)

// explScenario is what the explorer runs: a world, a setup that is not
// explored, and actors whose calls are.
type explScenario struct {
	name, about string
	nodes       int
	// failover is the volume's failover policy (contract.ParamFailover;
	// "": manual, the default).
	failover string
	// primary is the node the setup's create must place the volume on
	// ("": any); replicaOn the nodes it pushes a replica to.
	primary   string
	replicaOn []string
	// aliases lists nodes under a second address (alias -> node); the
	// lists that name them are nodePeers' (the nodes') and the actors'.
	aliases   map[string]string
	nodePeers func(node string, all []string) []string
	// witnesses names the witness set's nodes (Config.Witnesses); none:
	// every node counts.
	witnesses []string
	setup     func(x *explRun) error
	actors    func(x *explRun) []explActor
	// ctls are the controller instances faults may strike.
	ctls []string
}

// faultNodes are the nodes whose links to a controller instance a fault
// may cut.
func (sc *explScenario) faultNodes(x *explRun) []string {
	var out []string
	for _, n := range x.w.nodes {
		out = append(out, n.id)
	}
	return out
}

var explScenarios = map[string]*explScenario{}

func scenarioNames() []string {
	var out []string
	for n := range explScenarios {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func init() {
	for _, sc := range []*explScenario{moveBesidePublishBack(contract.FailoverManual), moveBesidePublishBack(contract.FailoverAuto),
		aliasedPeers(), forcedOutlivesItsMinority(), flushBesideMove(), moveOverABrokenLink(), witnessMajorityCutOff(),
		moveBesidePublishBackWitnesses()} {
		explScenarios[sc.name] = sc
	}
}

// moveBesidePublishBack is class 1 (two controller instances give two
// primaries): three nodes, the volume's primary on n1 (not mounted), a
// replica on n2. The CO publishes the volume on n2 through instance A,
// which moves it there, and at the same time on n1 through instance B
// (Nomad placing an allocation back on the source); each CO stages the
// volume where its publish answered. At most one copy may be staged
// writable. With failover "auto", B may also fail the volume over when
// its look finds no primary.
func moveBesidePublishBack(failover string) *explScenario {
	name, about := "move-beside-publish-back", "class 1: instance A moves the volume n1->n2 while instance B publishes it back on n1"
	if failover == contract.FailoverAuto {
		name += "-auto"
		about += " (failover auto)"
	}
	return &explScenario{
		name:      name,
		about:     about,
		nodes:     3,
		failover:  failover,
		primary:   "n1",
		replicaOn: []string{"n2"},
		ctls:      []string{"A", "B"},
		actors: func(x *explRun) []explActor {
			x.controller("A", x.allPeers())
			x.controller("B", x.allPeers())
			return []explActor{
				{name: "co-a", steps: []explStepFn{publishAndStage("co-a", "A", "n2")}},
				{name: "co-b", steps: []explStepFn{publishAndStage("co-b", "B", "n1")}},
			}
		},
	}
}

// moveBesidePublishBackWitnesses is class 1 over a witness set: four
// nodes, witnesses n1, n3 and n4, the volume's primary on n1 (not
// mounted), a replica on n2, which is not a witness, failover auto.
// Instance A moves the volume to n2 while instance B publishes it back
// on n1, as in move-beside-publish-back-auto: n2's promise and grants
// count for nothing toward a majority, while its own record still
// decides its promotion and its refusal of a failover.
func moveBesidePublishBackWitnesses() *explScenario {
	sc := moveBesidePublishBack(contract.FailoverAuto)
	sc.name, sc.about = "move-beside-publish-back-witnesses", "class 1 over witnesses n1,n3,n4 of four nodes: instance A moves the volume n1->n2 (not a witness) while instance B publishes it back on n1 (failover auto)"
	sc.nodes, sc.witnesses = 4, []string{"n1", "n3", "n4"}
	return sc
}

// aliasedPeers is class 4 (majorities counted addresses): four nodes;
// n1 lists n2 under a second address too (n2b), n3 and the controller
// list n4 under one (n4b). The volume's primary is on n1, staged there,
// a replica on n3. A split cuts n1 and n2 off from n3, n4, the
// controller and the CO. Each side is two of four nodes: n1 must lose
// its lease and fence its copy, and the controller must not fail the
// volume over. Counting addresses, n1 held its lease as three of five
// while the controller failed over to n3 as three of five, and n3 held
// its lease as three of five and staged it: two writers. The environment
// lets the lease and its margin pass (seven ticks), then the CO
// publishes the volume on n3 and stages it there.
func aliasedPeers() *explScenario {
	return &explScenario{
		name:      "aliased-peers",
		about:     "class 4: n1 lists n2 twice, n3 and the controller list n4 twice; a split {n1,n2} | {n3,n4,controller}",
		nodes:     4,
		failover:  contract.FailoverAuto,
		primary:   "n1",
		replicaOn: []string{"n3"},
		aliases:   map[string]string{"n2b": "n2", "n4b": "n4"},
		nodePeers: func(node string, all []string) []string {
			switch node {
			case "n1":
				return append(all, aliasAddr("n2b"))
			case "n3":
				return append(all, aliasAddr("n4b"))
			}
			return all
		},
		ctls:  []string{"A"},
		setup: stagedThenSplit("n1", "n2"),
		actors: func(x *explRun) []explActor {
			x.controller("A", append(x.allPeers(), aliasAddr("n4b")))
			return []explActor{
				{name: "env", steps: []explStepFn{ticks(7, "lease and margin passed")}},
				{name: "co", steps: []explStepFn{after("co", "lease and margin passed", publishAndStage("co", "A", "n3"))}},
			}
		},
	}
}

// witnessMajorityCutOff: the leases and a generation's majorities count
// a witness set (n1, n2, n4 of five nodes). The volume's primary is on
// n1, staged there, a replica on n3. A split cuts n1 and n2 off from n3,
// n4, n5, the controller and the CO: a majority of the witnesses on the
// cut side, a majority of all nodes on the other. n1 keeps its lease
// through n2, so the controller must not fail the volume over: its side
// holds one witness. The environment lets the lease and its margin pass
// (seven ticks), the CO publishes the volume on n3 and stages it there,
// then the split heals, a beat passes, and the CO tries n3 again.
// Counted over all nodes, three of five grant the failover during the
// split (n1 never pings n3 and n5, and n4 no longer hears it) and n3 is
// promoted; n3 cannot hold its lease on its side, but once the split
// heals it is staged beside n1, which never lost its lease.
func witnessMajorityCutOff() *explScenario {
	return &explScenario{
		name:      "witness-majority-cut-off",
		about:     "witnesses n1,n2,n4 of five nodes; a split {n1,n2} | {n3,n4,n5,controller}; the CO publishes on n3 after the lease and its margin, and after the heal",
		nodes:     5,
		failover:  contract.FailoverAuto,
		primary:   "n1",
		replicaOn: []string{"n3"},
		witnesses: []string{"n1", "n2", "n4"},
		ctls:      []string{"A"},
		setup:     stagedThenSplit("n1", "n2"),
		actors: func(x *explRun) []explActor {
			x.controller("A", x.allPeers())
			return []explActor{
				{name: "env", steps: []explStepFn{ticks(7, "lease and margin passed"), after("env", "tried n3", func(ctx context.Context, x *explRun) {
					x.env("Heal", "n1,n2", func() string { return x.heal("n1") + "; " + x.heal("n2") })
					ticks(1, "healed")(ctx, x)
				}, "healed")}},
				{name: "co", steps: []explStepFn{after("co", "lease and margin passed", func(ctx context.Context, x *explRun) {
					publishAndStage("co", "A", "n3")(ctx, x)
					x.reach("co", "tried n3", true)
				}, "tried n3")}},
				{name: "co2", steps: []explStepFn{after("co2", "healed", publishAndStage("co2", "A", "n3"))}},
			}
		},
	}
}

// forcedOutlivesItsMinority is class 2 (a forced promotion outlived its
// minority): five nodes, the volume's primary on n1, replicas on n2 and
// n3. n1 is lost for good and n3, n4 are cut off: the operator promotes
// n2 with promote -force, n2 and n5 answering, and the CO stages the
// volume there. Then n3 and n4 return, and a beat passes: a majority
// answers n2 again. Then n2 is cut off from everyone, the lease and its
// margin pass, and the CO publishes the volume on n3, which the majority
// fails over to. n2, under the lease again since the majority answered,
// must have fenced its copy by then. Kept exempt, it kept writing beside
// n3.
func forcedOutlivesItsMinority() *explScenario {
	return &explScenario{
		name:      "forced-outlives-its-minority",
		about:     "class 2: promote -force on n2 with n2,n5 answering; the majority returns; n2 is cut off; the majority fails over",
		nodes:     5,
		failover:  contract.FailoverAuto,
		primary:   "n1",
		replicaOn: []string{"n2", "n3"},
		ctls:      []string{"A", "B"},
		setup: func(x *explRun) error {
			x.powerOff("n1")
			x.isolate("n3")
			x.isolate("n4")
			return nil
		},
		actors: func(x *explRun) []explActor {
			x.controller("A", x.allPeers())
			x.controller("B", x.allPeers())
			return []explActor{
				{name: "op", steps: []explStepFn{func(ctx context.Context, x *explRun) {
					x.reach("op", "forced", x.promote(ctx, "op", "A", "n2", true) == nil)
				}}},
				{name: "co", steps: []explStepFn{after("co", "forced", func(ctx context.Context, x *explRun) {
					pub, err := x.publish(ctx, "co", "A", "n2")
					if err == nil {
						err = x.stage(ctx, "co", "n2", pub)
					}
					x.reach("co", "staged on n2", err == nil)
				}, "staged on n2")}},
				{name: "env", steps: []explStepFn{after("env", "staged on n2", func(ctx context.Context, x *explRun) {
					x.env("Heal", "n3,n4", func() string { return x.heal("n3") + "; " + x.heal("n4") })
					x.env("Tick", "", x.tickNow)
					x.env("Isolate", "n2", func() string { return x.isolate("n2") })
					ticks(7, "lease and margin passed")(ctx, x)
				}, "lease and margin passed")}},
				{name: "co2", steps: []explStepFn{after("co2", "lease and margin passed", publishAndStage("co2", "B", "n3"))}},
			}
		},
	}
}

// flushBesideMove: the flush at unpublish meets a move. Three nodes, the
// volume's primary on n1, unpublished, holding a write its replicas on n2
// and n3 lack. Instance B answered the unpublish and flushes the volume
// to the replicas while instance A moves it to n2 for the CO's publish
// there. A flush is a push: in any order of its calls among the move's
// (its look, the reservation, the fenced final push, the promotion, the
// demotion), with any fault among them, at most one copy is staged
// writable and the write is kept.
func flushBesideMove() *explScenario {
	return &explScenario{
		name:      "flush-beside-move",
		about:     "instance B flushes n1's unpublished primary to its replicas on n2 and n3 while instance A moves it to n2",
		nodes:     3,
		primary:   "n1",
		replicaOn: []string{"n2", "n3"},
		ctls:      []string{"A", "B"},
		setup:     ackedWrite("n1", "n1/before-the-unpublish"),
		actors: func(x *explRun) []explActor {
			x.controller("A", x.allPeers())
			x.controller("B", x.allPeers())
			return []explActor{
				{name: "co", steps: []explStepFn{publishAndStage("co", "A", "n2")}},
				{name: "unpublish", steps: []explStepFn{func(ctx context.Context, x *explRun) { x.flush(ctx, "unpublish", "B", "n1") }}},
			}
		},
	}
}

// moveOverABrokenLink: the link between a move's source and its target
// breaks and heals while the move runs. Three nodes, the volume's primary
// on n1, unpublished, holding a write its replicas on n2 and n3 lack.
// Instance A moves the volume to n2 for the CO's publish there, instance
// B publishes it back on n1 for another CO; meanwhile the link n1<->n2
// breaks (the controllers still reach both), a beat passes, and it heals.
// A stream that cannot reach its target must leave no copy promoted
// without the final snapshot: in any order of the break and the heal
// among the move's calls, with any fault among them, at most one copy is
// staged writable and the write is kept.
func moveOverABrokenLink() *explScenario {
	return &explScenario{
		name:      "move-over-a-broken-link",
		about:     "instance A moves n1's unpublished primary to n2 while B publishes it on n1; the link n1<->n2 breaks, a beat passes, it heals",
		nodes:     3,
		primary:   "n1",
		replicaOn: []string{"n2", "n3"},
		ctls:      []string{"A", "B"},
		setup:     ackedWrite("n1", "n1/before-the-move"),
		actors: func(x *explRun) []explActor {
			x.controller("A", x.allPeers())
			x.controller("B", x.allPeers())
			return []explActor{
				{name: "co-a", steps: []explStepFn{publishAndStage("co-a", "A", "n2")}},
				{name: "co-b", steps: []explStepFn{publishAndStage("co-b", "B", "n1")}},
				{name: "env", steps: []explStepFn{func(ctx context.Context, x *explRun) {
					x.env("Break", "n1,n2", func() string { x.cutNodes("n1", "n2", true); return "the link n1<->n2 is broken" })
					x.env("Tick", "", x.tickNow)
					x.env("Heal", "n1,n2", func() string { x.cutNodes("n1", "n2", false); return "the link n1<->n2 works again" })
				}}},
			}
		},
	}
}

// stagedThenSplit is a setup that stages the volume on node, its primary,
// and then splits node and others off from the rest of the nodes, the
// controller instances and the CO.
func stagedThenSplit(node string, others ...string) func(x *explRun) error {
	return func(x *explRun) error {
		if err := x.stageNow(node); err != nil {
			return fmt.Errorf("staging the volume on %s: %w", node, err)
		}
		x.split(append([]string{node}, others...)...)
		return nil
	}
}

// ackedWrite is a setup that writes token to the volume's copy on node
// and holds the checker to keeping it: a write the workload saw
// acknowledged before the scenario's calls, which no copy staged later
// may lack.
func ackedWrite(node, token string) func(x *explRun) error {
	return func(x *explRun) error {
		ds := rootDataset + "/" + x.vol.id
		if err := x.w.node(node).pool.Write(ds, token); err != nil {
			return err
		}
		x.w.checker.acked(ds, token)
		return nil
	}
}

type explStepFn = func(ctx context.Context, x *explRun)

// publishAndStage is one placement of the CO: ControllerPublishVolume on
// node through instance ctl, then, if it answered, the stage there.
func publishAndStage(actor, ctl, node string) explStepFn {
	return func(ctx context.Context, x *explRun) {
		pub, err := x.publish(ctx, actor, ctl, node)
		if err == nil {
			_ = x.stage(ctx, actor, node, pub)
		}
	}
}

// ticks lets n heartbeat intervals pass, one tick at a time (every node
// beats at each), then marks milestone.
func ticks(n int, milestone string) explStepFn {
	return func(ctx context.Context, x *explRun) {
		for range n {
			x.env("Tick", "", x.tickNow)
		}
		x.reach("env", milestone, true)
	}
}

// after runs step once milestone was reached, well: an actor that waits
// for another's step (the CO publishes elsewhere once the node is lost).
// Otherwise the actor gives up, and the milestones its step would have
// reached (then) are reached as failed.
func after(actor, milestone string, step explStepFn, then ...string) explStepFn {
	return func(ctx context.Context, x *explRun) {
		if x.await(actor, milestone) {
			step(ctx, x)
			return
		}
		x.note("%s: %s did not happen; gives up", actor, milestone)
		for _, m := range then {
			x.reach(actor, m, false)
		}
	}
}
