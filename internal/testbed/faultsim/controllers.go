package faultsim

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/zfs-nomad/zfs-nomad/internal/controller/cluster"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/csiserver"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/migration"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/provision"
	"github.com/zfs-nomad/zfs-nomad/internal/controller/scheduler"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/shared/worklease"
)

// simController is one controller instance, as a zfs-controller process
// wires it: its own connections to the agents, CSI controller, migrator,
// schedule, pass over deletions and work lease. Several run at once
// (Config.Controllers); the CO sends each call to any of them (co).
type simController struct {
	endpoint    string // its name on the network
	incarnation int    // starts so far, for its instance ID
	cl          *cluster.Cluster
	mig         *migration.Migrator
	ctl         *csiserver.Controller
	sched       *scheduler.Scheduler
	deletions   *provision.Provisioner
	lease       *worklease.Holder
}

// controllerName names the i-th controller instance on the network: the
// first is where the CO is too.
func controllerName(i int) string {
	if i == 0 {
		return controllerEndpoint
	}
	return fmt.Sprintf("%s%d", controllerEndpoint, i+1)
}

// co is the controller instance the CO sends its next call to: Nomad's
// servers send each controller call to any healthy instance. Dice are
// rolled only with several, so that a seed of one instance runs as
// before.
func (w *world) co() *simController {
	if w.forced != nil {
		return w.forced
	}
	if len(w.ctls) == 1 {
		return w.ctls[0]
	}
	return w.ctls[w.dice.intn(len(w.ctls))]
}

// start starts the instance anew (a restart: it keeps no state, and
// asks for the work lease as a new instance).
func (c *simController) start(w *world) {
	c.stop()
	c.incarnation++
	log := hclog.NewNullLogger()
	if w.cfg.Verbose {
		log = hclog.New(&hclog.LoggerOptions{Name: c.endpoint, Level: hclog.Debug})
	}
	c.cl = cluster.New(w.peers, 5*time.Second, log, w.net.dialOptions(c.endpoint, func() bool { return true })...)
	// The controller as shipped (config.DefaultController, as
	// zfs-controller wires it): moves catch their target up in the
	// background and a publish is granted ahead of a move's end, so the
	// background move, its final step and the CO's calls that arrive
	// while it runs meet the faults (docs/simulation.md, "What the
	// simulation runs").
	shipped := config.DefaultController()
	mig := migration.New(c.cl, log)
	mig.MaxCatchUps = shipped.MoveCatchUps
	mig.PublishAheadWithin = time.Duration(shipped.MovePublishAhead)
	// The flush at unpublish on, which is not the default: an operator
	// may turn it on, and it adds pushes at moments the schedule does
	// not choose, among the CO's calls.
	mig.NoFlush = false
	mig.SetClock(w.now)
	// A step is a second of the simulation's clock, and the CO's call
	// cannot see steps pass: waiting the shipped second of real time
	// for a move that lasts steps (network.lastSteps) would only slow
	// the run, and a move that ends at once still ends within this.
	mig.CatchUpWait = 20 * time.Millisecond
	c.mig = mig
	c.ctl = csiserver.New(c.cl, mig, "most-free", log)
	c.deletions = provision.New(c.cl, mig, "most-free", log)
	c.sched = scheduler.New(c.cl, 2, log)
	c.sched.Settle = mig.Settle
	// Surplus copies go as soon as they are surplus: the simulation's
	// checks (nothing acknowledged lost) then judge every removal.
	c.sched.SurplusGrace = 0
	c.sched.SetClock(w.now) // replicas' ages are on the nodes' clocks, near the simulation's
	self := worklease.Instance{ID: fmt.Sprintf("%s#%d", c.endpoint, c.incarnation), Host: c.endpoint}
	c.lease = worklease.NewHolder(self, cluster.WorkLeaseAsker(c.cl), log.Named("worklease"))
	c.lease.SetClock(w.now)
}

// stop ends the instance's background work and its belief in the work
// lease, as its exit would: no goroutine of a dead instance acts after
// its successor started, and its grants run out on the nodes by
// themselves.
func (c *simController) stop() {
	if c.mig != nil {
		c.mig.Stop()
	}
	if c.lease != nil {
		c.lease.Stop()
	}
	if c.cl != nil {
		c.cl.Close()
	}
}

// holds reports whether the instance believes it holds the work lease.
func (c *simController) holds() bool {
	_, ok := c.lease.Held()
	return ok
}

// holders are the instances that believe they hold the work lease: the
// ones that run the background work (the schedule, the pass over
// deletions), as zfs-controller runs it only while held.
func (w *world) holders() []*simController {
	var out []*simController
	for _, c := range w.ctls {
		if c.holds() {
			out = append(out, c)
		}
	}
	return out
}

// askForWorkLease lets each instance ask the nodes for the work lease
// every worklease.RenewEvery, as zfs-controller does, each at its own
// offset; then at most one may believe it holds it.
func (w *world) askForWorkLease() error {
	every := int(worklease.RenewEvery / time.Second)
	for i, c := range w.ctls {
		if (w.step+i)%every != 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c.lease.Try(ctx)
		cancel()
	}
	holders := w.holders()
	switch {
	case len(holders) > 1:
		var ids []string
		for _, h := range holders {
			ids = append(ids, h.lease.Self().ID)
		}
		return fmt.Errorf("two controller instances hold the work lease at once: %v", ids)
	case len(holders) == 1:
		w.stats.WorkLeaseHeld++
		if id := holders[0].lease.Self().ID; id != w.lastHolder {
			if w.lastHolder != "" {
				w.stats.WorkLeaseHandovers++
			}
			w.tracef("controller: %s holds the work lease", id)
			w.lastHolder = id
		}
	}
	return nil
}

// moveRunning reports a move of the volume running in the background on
// any instance, and to which node.
func (w *world) moveRunning(volumeID string) (string, bool) {
	for _, c := range w.ctls {
		if target, ok := c.mig.MoveRunning(volumeID); ok {
			return target, true
		}
	}
	return "", false
}
