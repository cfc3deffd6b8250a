package nomad

import (
	"flag"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
)

// Losing the client of the controller instance that holds the work lease,
// in the middle of a move and in the middle of a failover: the job must
// come up elsewhere with exactly its data, and a failover must cost no
// more than one whose lost client ran no active controller.

// drainWhileTheHolderDies drains the job's node to the third client and,
// once a controller logs that the move is under way, kills the client
// whose controller instance holds the work lease (kept ineligible, so
// that it is not the move's target): the other instance answers Nomad's
// retried publish and finishes the move (its catch-up resumes, its final
// step settles whatever the dead one left). The killed client is revived
// at the end. It returns the allocation that ran after the move.
func (e *e2e) drainWhileTheHolderDies(first allocation) allocation {
	e.t.Helper()
	e.waitForDeployment("counter")
	e.moveLeaseOff(first.node)
	holder := e.workLeaseHolder()
	// The move must go to the third client: killing its target would
	// leave a generation promised to a node that does not answer, and
	// rightly nothing would be published until it does (or an operator
	// says it is lost).
	e.nomad("node", "eligibility", "-disable", e.nodeIDs[holder])
	controllers := e.controllers()
	before := e.moveLogCounts()
	began := time.Now()
	e.nomad("node", "drain", "-enable", "-yes", "-ignore-system", "-deadline", "2m", e.nodeIDs[first.node])
	under := e.waitForMoveUnderWay(before)
	e.tell("the move is under way (%s) %s after the drain command; the work lease's holder's client %s dies now",
		under, time.Since(began).Round(100*time.Millisecond), holder)
	e.killNode(holder)
	moved := e.waitForCounter(first.id)
	e.tell("FIGURE drain move with the work lease's holder's client killed in the middle: %s (drain command to the job ready on %s; the drained client was %s; %s)",
		time.Since(began).Round(100*time.Millisecond), moved.node, first.node, controllers)
	if moved.node == holder || moved.node == first.node {
		e.t.Fatalf("the job runs on %s after the drain of %s and the death of %s", moved.node, first.node, holder)
	}
	e.logFailedAllocations()
	e.wantSameData(first, moved, true)
	e.waitForDrained(first.node)
	e.nomad("node", "eligibility", "-enable", e.nodeIDs[holder])
	e.reviveNode(holder)
	return moved
}

// moveLeaseOff makes sure the controller instance holding the work lease
// does not run on node. If it does, its task is sent SIGTERM: a clean
// stop releases the lease, and Nomad starts the task again only after
// its restart policy's delay (15 s for a service job), in which the
// other instance, asking every worklease.RenewEvery, takes the lease. A
// `nomad alloc restart` would not do: the restarted instance asks as it
// starts, and often wins the released lease back.
func (e *e2e) moveLeaseOff(node string) {
	e.t.Helper()
	if e.waitForWorkLeaseHolder() != node {
		return
	}
	const job, task = "zfs-nomad-controller", "zfs-controller"
	alloc := e.runningAlloc(job, node)
	before, _, _ := e.taskState(alloc, task)
	e.tell("the work lease's holder runs on %s, the job's node: its task stops until Nomad restarts it, so that the other instance takes the lease over", node)
	e.nomad("alloc", "signal", "-s", "SIGTERM", alloc, task)
	e.eventually(time.Minute, "the work lease held on another node than "+node, func() error {
		if holder := e.workLeaseHolder(); holder == "nobody" || holder == node {
			return fmt.Errorf("held by %s", holder)
		}
		return nil
	})
	e.waitForTaskRestarted(alloc, task, node, before)
	if holder := e.waitForWorkLeaseHolder(); holder == node {
		e.t.Fatalf("the work lease went back to %s: a newly started instance took it from the one holding it", node)
	}
}

// waitForWorkLeaseHolder waits until a controller instance holds the
// work lease, and names its node.
func (e *e2e) waitForWorkLeaseHolder() string {
	e.t.Helper()
	holder := "nobody"
	e.eventually(time.Minute, "a controller instance holding the work lease", func() error {
		if holder = e.workLeaseHolder(); holder == "nobody" {
			return fmt.Errorf("none holds it")
		}
		return nil
	})
	return holder
}

// moveLogLines are what a controller logs when a move starts: its
// catch-up in the background, or its final step.
var moveLogLines = []string{"catching the move's target up", "moving volume"}

// moveLogCounts counts moveLogLines in every node's controller logs.
func (e *e2e) moveLogCounts() map[string]int {
	e.t.Helper()
	counts := map[string]int{}
	for _, n := range e.c.Nodes {
		for _, line := range moveLogLines {
			c, err := e.taskLogCount(n.ID, "zfs-controller", line)
			if err != nil {
				continue // no controller there, or the node is down
			}
			counts[n.ID+": "+line] = c
		}
	}
	return counts
}

// waitForMoveUnderWay waits until a controller logged a move's start
// since before, and says which.
func (e *e2e) waitForMoveUnderWay(before map[string]int) string {
	e.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		for key, c := range e.moveLogCounts() {
			if c > before[key] {
				return key
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	e.t.Fatalf("no controller logged %q within 2m of the drain", moveLogLines)
	return ""
}

// reviveNode brings a killed node back as a rebooted machine comes back:
// its link up, its Docker Engine and Nomad client started again on the
// same state directories. Nomad then runs the system job's allocation (the
// node plugin) there again, and the node's plugin finds its pool as it
// was. It waits until the plugins are healthy on every node.
func (e *e2e) reviveNode(name string) {
	e.t.Helper()
	began := time.Now()
	e.restartClient(name)
	e.waitForPlugins(3, "")
	e.waitForChecks("zfs-nomad-node-metrics", 3)
	e.waitForChecks("zfs-nomad-controller-metrics", 2)
	e.spreadControllers()
	e.waitForControllerRecords(2)
	e.tell("%s is back: its Nomad client and plugins run again (%s)", name, time.Since(began).Round(100*time.Millisecond))
}

// restartClient brings a killed node's link back and starts its Docker
// Engine (docker flavour) and Nomad client again, which start its
// plugins and tasks; it waits for none of them.
func (e *e2e) restartClient(name string) {
	e.t.Helper()
	n := e.node(name)
	if err := n.RestoreLink(); err != nil {
		e.t.Fatal(err)
	}
	if e.flavour.docker {
		e.procs = append(e.procs, e.startDockerd(n))
		if err := waitForDocker(dockerSocket(n)); err != nil {
			e.t.Fatal(err)
		}
	}
	p, err := n.StartProcess("nomad-"+n.ID, filepath.Join(e.bin, "nomad"), "agent", "-config", e.writeFile("client-"+n.ID+".hcl", e.clientConfig(n)))
	if err != nil {
		e.t.Fatal(err)
	}
	e.procs = append(e.procs, p)
}

// spreadControllers puts the controller instances on two clients again
// when losing one crowded both onto one (Nomad's spread is a preference:
// it had no other client then). One of them is stopped, and Nomad places
// its replacement on another client, as an operator would have it, so
// that losing one client never loses both.
func (e *e2e) spreadControllers() {
	e.t.Helper()
	var allocs []struct{ ID, NodeName, ClientStatus string }
	if err := e.get("/v1/job/zfs-nomad-controller/allocations", &allocs); err != nil {
		e.t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range allocs {
		if a.ClientStatus != "running" {
			continue
		}
		if !seen[a.NodeName] {
			seen[a.NodeName] = true
			continue
		}
		e.tell("both controller instances run on %s: one is stopped so that Nomad places it on another client", a.NodeName)
		e.nomad("alloc", "stop", "-detach", a.ID)
		e.eventually(2*time.Minute, "the controller instances on two clients", func() error {
			if on := e.runningOn("zfs-nomad-controller"); len(on) != 2 || on[0] == on[1] {
				return fmt.Errorf("running on %v", on)
			}
			return nil
		})
		e.waitForChecks("zfs-nomad-controller-metrics", 2)
		return
	}
}

// waitForControllerRecords waits until Nomad's record of the plugin
// holds n controllers, every one healthy: after a client's loss and an
// instance stopped, it may still hold one that is gone, and the snapshot
// commands then answered "plugin does not support snapshot".
func (e *e2e) waitForControllerRecords(n int) {
	e.t.Helper()
	e.eventually(2*time.Minute, fmt.Sprintf("Nomad's plugin record with %d healthy controllers and no other", n), func() error {
		var p struct {
			Controllers map[string]struct{ Healthy bool }
		}
		if err := e.get("/v1/plugin/csi/zfs-nomad", &p); err != nil {
			return err
		}
		healthy := 0
		for _, c := range p.Controllers {
			if c.Healthy {
				healthy++
			}
		}
		if len(p.Controllers) != n || healthy != n {
			return fmt.Errorf("%d controllers recorded, %d healthy", len(p.Controllers), healthy)
		}
		return nil
	})
}

// runCounterNear runs the example job on volume, preferring node (an
// affinity, so that Nomad may still reschedule it elsewhere when node
// dies), and waits until it is ready there.
func (e *e2e) runCounterNear(volume, node string) allocation {
	e.t.Helper()
	spec := e.readFile(e.file("example-job.nomad.hcl"))
	group := regexp.MustCompile(`group "counter" \{`)
	if !group.MatchString(spec) {
		e.t.Fatal(`nomad/example-job.nomad.hcl has no group "counter" any more: update this test`)
	}
	spec = group.ReplaceAllLiteralString(spec, fmt.Sprintf("group \"counter\" {\n    affinity {\n      attribute = \"${node.unique.name}\"\n      value     = %q\n      weight    = 100\n    }\n", node))
	path := e.writeFile("counter-near-"+node+".nomad.hcl", spec)
	e.nomad(append(append([]string{"job", "run", "-detach", "-var", "volume=" + volume}, e.counterVars()...), path)...)
	a := e.waitForCounter("")
	if a.node != node {
		e.t.Fatalf("the counter job runs on %s, not on %s as its affinity asked", a.node, node)
	}
	return a
}

// timedFailover loses the job's node (lose: killNode, or a cut-off that
// the job's disconnect block must end) and waits for the job elsewhere
// with its data; it returns the time from the loss to the job ready, and
// the allocation.
func (e *e2e) timedFailover(volume string, before allocation, lose func(allocation)) (time.Duration, allocation) {
	e.t.Helper()
	e.backup(e.externalID(volume)) // what a failover keeps is what was replicated
	e.waitForDeployment("counter")
	began := time.Now()
	lose(before)
	after := e.waitForCounter(before.id)
	took := time.Since(began)
	e.logFailedAllocations()
	e.wantSameData(before, after, true)
	return took, after
}

// failoverWithTheHolder adds to the failover=auto step a first failover
// whose lost client runs the job and the controller instance holding the
// work lease (make test-nomad). Not part of make test: the drain step
// already loses the holder's client in the middle of a move, so the
// instance taking over under Nomad is proven there, and this failover
// and the client's revival cost about three minutes more (2026-12-07:
// 1m19s and 1m13s), which CI's 90 minutes do not have.
var failoverWithTheHolder = flag.Bool("failover-with-holder", false, "also fail over once with the work lease's holder on the lost client")

// failoverAuto runs the automatic failovers of one volume: with
// -failover-with-holder first the client running the job and the
// controller instance holding the work lease dies (and comes back); then
// a client running the job and no controller instance is cut off with
// its zfs-node down, and dies once its task stopped. It returns the node
// of the last, which stays dead.
func (e *e2e) failoverAuto() string {
	e.t.Helper()
	spec := strings.NewReplacer(`"web-data"`, `"web-data-auto"`, `failover = "manual"`, `failover = "auto"`).
		Replace(e.readFile(e.file("volume.hcl")))
	if !strings.Contains(spec, `failover = "auto"`) {
		e.t.Fatal("nomad/volume.hcl no longer says failover = \"manual\": update this test")
	}
	e.createVolume(e.writeFile("auto.hcl", spec))

	var withHolder time.Duration
	if *failoverWithTheHolder {
		withHolder = e.failoverWithTheHolder()
	}
	e.waitForWorkLeaseHolder()
	victim := ""
	withController := e.runningOn("zfs-nomad-controller")
	for _, n := range e.c.Nodes {
		if !slices.Contains(withController, n.ID) {
			victim = n.ID // both instances survive it
		}
	}
	if victim == "" {
		e.t.Fatalf("the controller instances run on %v: no client runs none", withController)
	}
	before := e.runCounterNear("web-data-auto", victim)
	controllers := e.controllers()
	without, after := e.timedFailover("web-data-auto", before, e.cutOffWithItsNodePluginDown)
	e.tell("FIGURE failover, the lost client ran no controller instance: %s (node %s cut off to the job ready on %s; %s)",
		without.Round(100*time.Millisecond), victim, after.node, controllers)
	if withHolder > 0 {
		e.tell("FIGURE failover with the work lease's holder lost / with no controller lost: %.2f", withHolder.Seconds()/without.Seconds())
	}
	return victim
}

// failoverWithTheHolder runs the job next to the work lease's holder,
// kills that client, waits for the job elsewhere with its data, revives
// the client and stops the job. It returns the failover's time.
func (e *e2e) failoverWithTheHolder() time.Duration {
	e.t.Helper()
	holder := e.waitForWorkLeaseHolder()
	before := e.runCounterNear("web-data-auto", holder)
	controllers := e.controllers()
	took, after := e.timedFailover("web-data-auto", before, func(a allocation) { e.killNode(a.node) })
	e.tell("FIGURE failover, the lost client ran the work lease's holder: %s (node %s killed to the job ready on %s; %s)",
		took.Round(100*time.Millisecond), holder, after.node, controllers)
	e.reviveNode(holder)
	e.nomad("job", "stop", "-purge", "counter")
	return took
}

// cutOffWithItsNodePluginDown cuts the link of a's node while its Nomad
// client and the job's task run on, and keeps its zfs-node down. Nothing
// of the driver can fence the task's mount then: only the job's
// disconnect block (stop_on_client_after, guarantee 4 of docs/install.md)
// stops the task writing, and it must do so before a failover can make
// another copy writable. That is no earlier than lease + lease_margin
// after the node's last majority, which may be up to a ping interval
// (lease/4) before the cut. Once the task is gone every process of the
// node is killed, as killNode leaves it.
func (e *e2e) cutOffWithItsNodePluginDown(a allocation) {
	e.t.Helper()
	n := e.node(a.node)
	defaults := config.DefaultNode()
	lease, margin := time.Duration(defaults.Lease), time.Duration(defaults.LeaseMargin)
	earliestPromotion := lease + margin - lease/4
	// What the checks below look for must be there to begin with.
	if len(taskProcesses(n, a.id)) == 0 {
		e.t.Fatalf("no process of allocation %s found on %s: the check of its stop would pass by itself", a.id, a.node)
	}
	e.tell("%s is cut off with its zfs-node down: its Nomad client and the job's task run on", a.node)
	began := time.Now()
	if err := n.CutLink(); err != nil {
		e.t.Fatal(err)
	}
	if killCommand(n, "zfs-node") == 0 {
		e.t.Fatalf("no zfs-node process found on %s to kill", a.node)
	}
	// Nomad's client restarts the plugin's task on its own, cut off or
	// not: kill every zfs-node that starts until the task is gone.
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			killCommand(n, "zfs-node")
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	e.eventually(earliestPromotion, "the task of allocation "+a.id+" on the cut-off "+a.node+" stopped by its disconnect block", func() error {
		if pids := taskProcesses(n, a.id); len(pids) > 0 {
			return fmt.Errorf("its processes %v still run", pids)
		}
		return nil
	})
	e.tell("FIGURE a cut-off client's task stopped by stop_on_client_after %s after the cut (its zfs-node down; no failover can promote before %s)",
		time.Since(began).Round(time.Second), earliestPromotion)
	e.killEveryProcess(n)
}
