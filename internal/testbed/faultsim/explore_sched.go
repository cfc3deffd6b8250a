package faultsim

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/errdefs"
)

// The explorer's scheduler (docs/simulation.md, "The explorer"). Every remote
// call between the actors of a run (a controller instance's call to a
// node agent, the CO's stage on a node, the environment's tick, cut or
// heal) blocks at a gate in two places: before its effect (the request is
// in flight) and after it (the answer is in flight). The scheduler lets
// one of the waiting calls through at a time, at a quiescent moment only:
// every goroutine of the run blocked, so what is pending is all that can
// happen next and the choice among it is the whole of the interleaving.

// explKind is what letting an event through does.
type explKind int

const (
	// explReply delivers a call's answer to its caller; the caller runs
	// on until it blocks again (its next calls, or the end of its work).
	explReply explKind = iota
	// explEffect delivers a call's request: its effect runs on the node
	// (or, for the environment's actions, on the world) to the end.
	explEffect
	// explFault crashes a controller instance or cuts one actor's link to
	// a node: what is in flight there is lost, and every later call fails
	// at once.
	explFault
)

// explEvent is one thing the scheduler may let happen next.
type explEvent struct {
	key   string // names it across runs: the same call of the same history
	kind  explKind
	actor string   // who acts: a controller instance, a CO, the operator, env
	nodes []string // the nodes its effect touches; "*" for all (env)
	read  bool     // an effect that changes nothing
	label string   // for the trace
	// issue is what the event causally follows when it becomes pending:
	// the trace indexes its actor knew of (faults: nothing).
	issue explClock
	call  *explCall // the gated call, for replies and effects
	fault func()    // for faults
}

// dependent reports whether a and b may not commute: swapping them can
// change what follows. Effects on a node commute with effects on other
// nodes, and reads with reads; answers change only their caller's
// goroutines, which collect them, so they commute with every effect and
// with each other (a fan-out's answers are collected in any order). An
// action of the environment moves the clock, cuts links or beats every
// node: it depends on every event. A fault depends on the events of the
// actor (and link) it strikes, and on every other fault (they share the
// budget).
func (a *explEvent) dependent(b *explEvent) bool {
	if a.kind == explFault || b.kind == explFault {
		if a.kind == explFault && b.kind == explFault {
			return true
		}
		f, o := a, b
		if b.kind == explFault {
			f, o = b, a
		}
		if o.actor != f.actor {
			return false
		}
		return len(f.nodes) == 0 || touches(o.nodes, f.nodes[0])
	}
	if a.envEffect() || b.envEffect() {
		return true
	}
	if a.kind == explReply || b.kind == explReply {
		return false
	}
	if a.read && b.read {
		return false
	}
	for _, n := range a.nodes {
		if touches(b.nodes, n) {
			return true
		}
	}
	return false
}

// meta is ev without what ties it to one run: what the exhaustive
// search keeps of it across runs.
func (ev *explEvent) meta() *explEvent {
	return &explEvent{key: ev.key, kind: ev.kind, actor: ev.actor, nodes: ev.nodes, read: ev.read, label: ev.label}
}

func (a *explEvent) envEffect() bool { return a.actor == "env" && a.kind == explEffect }

func touches(nodes []string, n string) bool {
	return slices.Contains(nodes, "*") || n == "*" || slices.Contains(nodes, n)
}

// explClock is a set of trace indexes: what an event causally follows.
type explClock []uint64

func (c explClock) has(i int) bool { return i/64 < len(c) && c[i/64]&(1<<(i%64)) != 0 }

func (c *explClock) add(i int) {
	for len(*c) <= i/64 {
		*c = append(*c, 0)
	}
	(*c)[i/64] |= 1 << (i % 64)
}

func (c *explClock) join(o explClock) {
	for len(*c) < len(o) {
		*c = append(*c, 0)
	}
	for i, w := range o {
		(*c)[i] |= w
	}
}

func (c explClock) clone() explClock { return slices.Clone(c) }

// explCall is one gated call.
type explCall struct {
	ev *explEvent // its effect, then its reply
	// answered: the effect ran and the answer waits (reply pending).
	answered bool
	result   string
	effectAt int           // the trace index of its effect
	verdict  chan error    // nil: go on; an error: lost
	effected chan struct{} // closed once the effect ran
}

// explStep is one executed event of a run.
type explStep struct {
	ev     *explEvent
	clock  explClock // what it causally follows
	result string
}

// explSched is the scheduler of one run.
type explSched struct {
	mu      sync.Mutex
	pending []*explCall // calls whose request or answer waits
	seen    map[string]int
	dead    map[string]bool   // crashed actors (controller instances)
	cut     map[string]string // actor|node -> why the link is down
	down    func(node string) string
	clocks  map[string]explClock // what each actor causally knows
	trace   []explStep
	faults  int
	ended   bool // the run is over: every call fails at once
}

func newExplSched(down func(node string) string) *explSched {
	return &explSched{seen: map[string]int{}, dead: map[string]bool{}, cut: map[string]string{}, down: down, clocks: map[string]explClock{}}
}

// explLost is what a call whose request or answer was lost returns: an
// Unavailable, as a gRPC client returns one.
type explLost struct{ why string }

func (e explLost) Error() string { return "unavailable: explorer: " + e.why }
func (e explLost) Unwrap() error { return errdefs.ErrUnavailable }

func errLost(why string) error { return explLost{why} }

func errLostIs(err error) bool {
	var l explLost
	return errors.As(err, &l)
}

// explSpec describes a call to gate.
type explSpec struct {
	actor, node, method, args string
	also                      []string // other nodes its effect touches
	read                      bool
}

// call gates one call: it waits for its request to be let through, runs
// effect, and waits for its answer to be let through. A call on a link
// that is down fails at once, with no event: nothing reaches the node.
func (s *explSched) call(spec explSpec, effect func() (string, error)) error {
	s.mu.Lock()
	if why := s.linkDownLocked(spec.actor, spec.node); why != "" {
		s.mu.Unlock()
		return errLost(why)
	}
	base := fmt.Sprintf("%s:%s@%s", spec.actor, spec.method, spec.node)
	if spec.args != "" {
		base = fmt.Sprintf("%s:%s(%s)@%s", spec.actor, spec.method, spec.args, spec.node)
	}
	s.seen[base]++
	nodes := append([]string{spec.node}, spec.also...)
	c := &explCall{verdict: make(chan error, 1), effected: make(chan struct{})}
	c.ev = &explEvent{key: fmt.Sprintf("%s#%d", base, s.seen[base]), kind: explEffect, actor: spec.actor, nodes: nodes, read: spec.read,
		label: base, issue: s.clocks[spec.actor].clone(), call: c}
	s.pending = append(s.pending, c)
	s.mu.Unlock()

	if err := <-c.verdict; err != nil {
		return err
	}
	result, err := effect()
	if result == "" {
		result = errText(err)
	}
	s.mu.Lock()
	c.answered, c.result = true, result
	s.mu.Unlock()
	close(c.effected)
	if lost := <-c.verdict; lost != nil {
		return lost
	}
	return err
}

// linkDownLocked says why actor's calls to node fail at once ("" if
// they go through).
func (s *explSched) linkDownLocked(actor, node string) string {
	switch {
	case s.ended:
		return "the run ended"
	case s.dead[actor]:
		return actor + " has crashed"
	case s.cut[actor+"|"+node] != "":
		return s.cut[actor+"|"+node]
	case s.cut["*|"+node] != "":
		return s.cut["*|"+node]
	}
	if node != "*" && s.down != nil {
		return s.down(node)
	}
	return ""
}

// enabled lists what may happen next, in a canonical order: answers,
// then effects, each by key (the order the calls arrived in depends on
// the Go scheduler; the order of this list does not).
func (s *explSched) enabled() []*explEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*explEvent
	for _, c := range s.pending {
		ev := c.ev
		if c.answered {
			ev = &explEvent{key: c.ev.key + "/answer", kind: explReply, actor: c.ev.actor, nodes: c.ev.nodes,
				label: c.ev.label + " answered: " + c.result, call: c}
			ev.issue = s.trace[c.effectAt].clock.clone()
			ev.issue.add(c.effectAt)
		}
		out = append(out, ev)
	}
	slices.SortFunc(out, func(a, b *explEvent) int {
		if a.kind != b.kind {
			return int(a.kind) - int(b.kind)
		}
		return strings.Compare(a.key, b.key)
	})
	return out
}

// faultEvents are the faults that may strike next: a crash of each
// controller instance alive, a cut of each of its links to a node.
func (s *explSched) faultEvents(ctls, nodes []string) []*explEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*explEvent
	for _, a := range ctls {
		if s.dead[a] {
			continue
		}
		out = append(out, &explEvent{key: "crash " + a, kind: explFault, actor: a, label: "fault: controller instance " + a + " crashes",
			fault: func() { s.crash(a) }})
		for _, n := range nodes {
			if s.cut[a+"|"+n] != "" {
				continue
			}
			out = append(out, &explEvent{key: "cut " + a + "-" + n, kind: explFault, actor: a, nodes: []string{n},
				label: "fault: the link " + a + "<->" + n + " is cut", fault: func() { s.cutLink(a, n, "link "+a+"<->"+n+" is cut") }})
		}
	}
	return out
}

// crash kills a controller instance: what it has in flight is lost, and
// its later calls fail at once.
func (s *explSched) crash(actor string) {
	s.mu.Lock()
	s.dead[actor] = true
	s.mu.Unlock()
	s.loseWhere(func(c *explCall) bool { return c.ev.actor == actor }, actor+" has crashed")
}

// cutLink cuts actor's link to node ("*": every actor's): what is in
// flight on it is lost, and later calls on it fail at once.
func (s *explSched) cutLink(actor, node, why string) {
	s.mu.Lock()
	s.cut[actor+"|"+node] = why
	s.mu.Unlock()
	s.loseWhere(func(c *explCall) bool { return (actor == "*" || c.ev.actor == actor) && c.ev.nodes[0] == node }, why)
}

// heal lifts the environment's cuts of node's links.
func (s *explSched) heal(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cut, "*|"+node)
}

func (s *explSched) loseWhere(match func(*explCall) bool, why string) {
	s.mu.Lock()
	var lost []*explCall
	s.pending = slices.DeleteFunc(s.pending, func(c *explCall) bool {
		if match(c) {
			lost = append(lost, c)
			return true
		}
		return false
	})
	s.mu.Unlock()
	for _, c := range lost {
		c.verdict <- errLost(why)
	}
}

// execute lets ev happen and waits until the run is quiescent again.
func (s *explSched) execute(ev *explEvent) {
	s.mu.Lock()
	idx := len(s.trace)
	clock := ev.issue.clone()
	for i, st := range s.trace {
		if st.ev.dependent(ev) {
			clock.add(i)
			clock.join(st.clock)
		}
	}
	s.trace = append(s.trace, explStep{ev: ev, clock: clock})
	if ev.kind == explFault {
		s.faults++
	}
	if ev.kind == explReply {
		s.pending = slices.DeleteFunc(s.pending, func(c *explCall) bool { return c == ev.call })
		// The caller now knows what the answer followed.
		known := s.clocks[ev.actor]
		known.join(clock)
		known.add(idx)
		s.clocks[ev.actor] = known
	}
	if ev.kind == explEffect {
		ev.call.effectAt = idx
	}
	s.mu.Unlock()

	switch ev.kind {
	case explFault:
		ev.fault()
	case explEffect:
		ev.call.verdict <- nil
		select {
		case <-ev.call.effected:
		case <-time.After(effectTimeout):
			panic(fmt.Sprintf("explorer: the effect of %s did not end within %s:\n%s", ev.key, effectTimeout, goroutines()))
		}
		s.mu.Lock()
		s.trace[idx].result = ev.call.result
		if ev.actor == "env" {
			// The environment's actions are one actor's sequence.
			known := s.clocks["env"]
			known.join(clock)
			known.add(idx)
			s.clocks["env"] = known
		}
		s.mu.Unlock()
	case explReply:
		ev.call.verdict <- nil
	}
	quiesce()
}

// join makes actor know what other knows: a CO's call into a controller
// instance carries what the CO knew, and its answer what the instance knew.
func (s *explSched) join(actor, other string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	known := s.clocks[actor]
	known.join(s.clocks[other])
	s.clocks[actor] = known
}

// abandon loses every pending call (the run ends): their goroutines see
// their calls fail and wind down.
func (s *explSched) abandon() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.loseWhere(func(*explCall) bool { return true }, "the run ended")
}

// effectTimeout bounds one effect in real time: every effect is a few
// calls into in-memory pools.
const effectTimeout = time.Minute

// goroutines dumps every goroutine's stack, for a run that hangs.
func goroutines() string {
	buf := make([]byte, 1<<22)
	return string(buf[:runtime.Stack(buf, true)])
}

// quiescence: the explorer runs with one P (GOMAXPROCS 1), so once the
// scheduler's goroutine yields and gets the P back with no goroutine
// runnable, every goroutine of the run is blocked: at a gate, on another
// goroutine, on a timer, or in a system call. The runtime counts the
// runnable ones under its scheduler lock. A goroutine in a system call
// (a pipe's read or write, a directory made for a stage) is not waited
// for: the system calls of the run are within effects, which the
// scheduler waits for by their end (explSched.execute).
var quietSamples = []metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}

// quietPolls bounds the yields one quiescence waits for (a goroutine
// that never blocks): each is microseconds.
const quietPolls = 10_000_000

func quiesce() {
	for i := 0; i < quietPolls; i++ {
		runtime.Gosched()
		metrics.Read(quietSamples)
		if quietSamples[0].Value.Uint64() == 0 {
			return
		}
	}
	panic("explorer: the run never became quiescent:\n" + goroutines())
}
