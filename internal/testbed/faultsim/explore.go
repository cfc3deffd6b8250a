package faultsim

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// The explorer (docs/simulation.md, "The explorer") runs a scenario's actors
// (controller instances running the real Migrator, a CO, an operator,
// the environment) over real node processes, and enumerates the
// interleavings of their remote calls, each call's effect and its answer
// two steps (explore_sched.go), with faults (a controller instance's
// crash, the cut of one of its links) at any step. It checks the
// simulation's invariants (check.go) at every step.
//
// Exhaustive mode is a stateless search with dynamic partial-order
// reduction (Flanagan and Godefroid, POPL 2005) and sleep sets
// (Godefroid, 1996): it runs the scenario again and again from its
// start, each run along a schedule, and after each step finds the races
// of the run so far (two dependent events neither of which causally
// follows the other) and schedules the reversed order for a later run.
// Every interleaving of the scenario is equivalent, up to the order of
// independent events, to one it runs, within its bound: at most
// ExploreConfig.Faults faults per run. Random mode runs seeded random
// schedules with random faults beyond that bound.

// ExploreConfig is one exploration.
type ExploreConfig struct {
	// Scenario names one of the scenarios (explScenarios).
	Scenario string
	// Faults bounds the faults of one run in the exhaustive search.
	Faults int
	// MaxRuns and Budget stop the exhaustive search early (0: no limit);
	// the result then says it did not finish.
	MaxRuns int
	Budget  time.Duration
	// RandomRuns random schedules follow the exhaustive search, from
	// RandomSeed on, with at most RandomFaults faults each.
	RandomRuns   int
	RandomSeed   uint64
	RandomFaults int
	// Seed, when set, replays that random run alone (with its trace).
	Seed uint64
	// SearchSeed seeds the exhaustive search's first choice at each new
	// state: which schedules it runs first, not which it covers.
	SearchSeed uint64
	// MaxSteps bounds one run.
	MaxSteps int
	Dir      string
	// Log, when set, gets the search's progress; Trace, when set, the
	// trace of its first run, line by line.
	Log   func(string)
	Trace func(string)
}

// ExploreResult is what an exploration covered and found.
type ExploreResult struct {
	Scenario string
	// Runs are the schedules run; States the distinct states they
	// reached (schedule prefixes); Steps every step run, replays of
	// prefixes included.
	Runs, States, Steps int
	// Finished: the exhaustive search ran every schedule within its
	// bound.
	Finished                   bool
	RandomRuns, RandomSteps    int
	Divergences, Stuck, Capped int
	// SleepBlocked: runs that ended where every enabled event was
	// asleep (an equivalent schedule ran already).
	SleepBlocked           int
	Elapsed, RandomElapsed time.Duration
	Violation              *ExploreViolation
}

func (r ExploreResult) String() string {
	s := r.Scenario + ":"
	if r.Runs > 0 {
		s += fmt.Sprintf(" exhaustive search %s: %d runs, %d states, %d steps in %s;", map[bool]string{true: "finished", false: "stopped early"}[r.Finished],
			r.Runs, r.States, r.Steps, r.Elapsed.Round(time.Millisecond))
	}
	if r.RandomRuns > 0 {
		s += fmt.Sprintf(" random: %d runs, %d steps in %s;", r.RandomRuns, r.RandomSteps, r.RandomElapsed.Round(time.Millisecond))
	}
	if r.SleepBlocked > 0 {
		s += fmt.Sprintf(" %d runs cut short as equivalent to one run before;", r.SleepBlocked)
	}
	if r.Divergences+r.Stuck+r.Capped > 0 {
		s += fmt.Sprintf(" %d replays diverged, %d runs stuck, %d runs capped;", r.Divergences, r.Stuck, r.Capped)
	}
	return strings.TrimSuffix(s, ";")
}

// ExploreViolation is an invariant broken by one schedule.
type ExploreViolation struct {
	Err error
	// Trace is the run's, step by step with the actors' lines; Minimal
	// the trace of the violation's causal past alone, replayed (the
	// whole trace if that replay did not break the invariant).
	Trace   []string
	Minimal []string
	Seed    uint64 // the random run's seed (0: the exhaustive search)
}

func (v *ExploreViolation) Error() string {
	out := fmt.Sprintf("%v\n  minimal trace (%d steps):\n    %s", v.Err, countSteps(v.Minimal), strings.Join(v.Minimal, "\n    "))
	if v.Seed != 0 {
		out += fmt.Sprintf("\n  (random run, seed %d)", v.Seed)
	}
	return out
}

func countSteps(lines []string) int {
	n := 0
	for _, l := range lines {
		if !strings.HasPrefix(l, "      ") {
			n++
		}
	}
	return n
}

// explMaxSteps bounds one run by default: a scenario's runs take tens of
// steps; one that reaches this is caught in a loop.
const explMaxSteps = 600

// Explore runs one exploration.
func Explore(cfg ExploreConfig) (ExploreResult, error) {
	sc, ok := explScenarios[cfg.Scenario]
	if !ok {
		return ExploreResult{}, fmt.Errorf("no scenario %q (have %s)", cfg.Scenario, strings.Join(scenarioNames(), ", "))
	}
	if cfg.MaxSteps == 0 {
		cfg.MaxSteps = explMaxSteps
	}
	// One P: quiescence is then "nothing runnable" (explore_sched.go).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	e := &explorer{cfg: cfg, sc: sc, res: ExploreResult{Scenario: cfg.Scenario}}
	if cfg.Seed != 0 {
		start := time.Now()
		err := e.random(cfg.Seed, cfg.Seed)
		e.res.RandomElapsed = time.Since(start)
		return e.res, err
	}
	start := time.Now()
	err := e.exhaustive()
	e.res.Elapsed = time.Since(start)
	if err != nil || e.res.Violation != nil || cfg.RandomRuns == 0 {
		return e.res, err
	}
	start = time.Now()
	err = e.random(cfg.RandomSeed, cfg.RandomSeed+uint64(cfg.RandomRuns)-1)
	e.res.RandomElapsed = time.Since(start)
	return e.res, err
}

type explorer struct {
	cfg ExploreConfig
	sc  *explScenario
	res ExploreResult
	// replaying: a minimal trace's replay, which reports its trace as it
	// is.
	replaying bool
	traced    bool // the first run's trace went to cfg.Trace
}

// explNode is one state of the exhaustive search's tree: a schedule
// prefix, what was enabled there, what must be tried from it (backtrack)
// and what was.
type explNode struct {
	parent *explNode
	depth  int
	// deviations: choices on the way here that were not the first a run
	// made at their state; the search tries schedules with fewer first.
	deviations int
	enabled    []string // keys, in the canonical order
	events     map[string]*explEvent
	backtrack  map[string]bool
	tried      []string // in the order tried
	// sleep are events a sibling state already tried first that nothing
	// since depended on: every schedule that starts with one of them
	// from here is equivalent to one that sibling explores (sleep sets,
	// Godefroid 1996).
	sleep    map[string]*explEvent
	children map[string]*explNode
}

func newExplNode(parent *explNode, deviations int, sleep map[string]*explEvent, enabled []*explEvent) *explNode {
	n := &explNode{parent: parent, deviations: deviations, backtrack: map[string]bool{}, events: map[string]*explEvent{}, sleep: sleep,
		children: map[string]*explNode{}}
	if parent != nil {
		n.depth = parent.depth + 1
	}
	for _, ev := range enabled {
		n.enabled = append(n.enabled, ev.key)
		n.events[ev.key] = ev.meta()
	}
	return n
}

func (n *explNode) has(key string) bool { return n.events[key] != nil }

func (n *explNode) wasTried(key string) bool { return slices.Contains(n.tried, key) }

// childSleep is the sleep set of the state that follows choosing key
// here: what was asleep here or tried before key, independent of it.
func (n *explNode) childSleep(key string) map[string]*explEvent {
	chosen := n.events[key]
	out := map[string]*explEvent{}
	for k, ev := range n.sleep {
		if !ev.dependent(chosen) {
			out[k] = ev
		}
	}
	for _, k := range n.tried {
		if ev := n.events[k]; k != key && !ev.dependent(chosen) {
			out[k] = ev
		}
	}
	return out
}

// chooser picks the next event of a run from the enabled ones (effects
// and answers, then the faults the budget allows); nil ends the run.
type chooser func(depth int, enabled, faults []*explEvent, s *explSched) *explEvent

// explTodo is a schedule the search must still run: from state at, key
// first.
type explTodo struct {
	at  *explNode
	key string
}

// exhaustive is the search with dynamic partial-order reduction and sleep
// sets. The schedules still to run are kept in a tree of states, and run
// fewest deviations first (choices a race analysis added, against those
// a run made by itself); a run's own choice at a new state is the
// dice's, so the first runs already spread over the tree. The order does
// not change what the search covers once it has finished, only how soon
// it meets a violation.
func (e *explorer) exhaustive() error {
	var root *explNode
	var todo []explTodo // a heap by (deviations, -depth)
	less := func(a, b explTodo) bool {
		if a.at.deviations != b.at.deviations {
			return a.at.deviations < b.at.deviations
		}
		return a.at.depth > b.at.depth
	}
	push := func(t explTodo) {
		todo = append(todo, t)
		for i := len(todo) - 1; i > 0; {
			p := (i - 1) / 2
			if !less(todo[i], todo[p]) {
				break
			}
			todo[i], todo[p] = todo[p], todo[i]
			i = p
		}
	}
	pop := func() explTodo {
		top := todo[0]
		last := len(todo) - 1
		todo[0] = todo[last]
		todo = todo[:last]
		for i := 0; ; {
			l, r, m := 2*i+1, 2*i+2, i
			if l < len(todo) && less(todo[l], todo[m]) {
				m = l
			}
			if r < len(todo) && less(todo[r], todo[m]) {
				m = r
			}
			if m == i {
				break
			}
			todo[i], todo[m] = todo[m], todo[i]
			i = m
		}
		return top
	}
	onBacktrack := func(n *explNode, key string) {
		if !n.backtrack[key] {
			n.backtrack[key] = true
			if !n.wasTried(key) && n.sleep[key] == nil {
				push(explTodo{at: n, key: key})
			}
		}
	}
	start := time.Now()
	dice := newDice(e.cfg.SearchSeed + 1)
	var target *explTodo // nil: the first run
	for {
		// The path to the target state, from the root.
		var path []*explNode
		for n := target.nodeOrNil(); n != nil; n = n.parent {
			path = append([]*explNode{n}, path...)
		}
		diverged := false
		var cur []*explNode // the run's states so far
		choose := func(depth int, enabled, faults []*explEvent, s *explSched) *explEvent {
			all := append(slices.Clone(enabled), faults...)
			find := func(key string) *explEvent {
				for _, ev := range all {
					if ev.key == key {
						return ev
					}
				}
				diverged = true
				return nil
			}
			if depth < len(path)-1 {
				return find(cur[depth].childKey(path[depth+1]))
			}
			n := cur[depth]
			if depth == len(path)-1 && target != nil {
				ev := find(target.key)
				if ev != nil {
					n.tried = append(n.tried, target.key)
					n.children[target.key] = newChildPlaceholder(n, n.deviations+1, n.childSleep(target.key))
				}
				return ev
			}
			var awake []*explEvent
			for _, ev := range enabled {
				if n.sleep[ev.key] == nil {
					awake = append(awake, ev)
				}
			}
			if len(awake) > 0 {
				// The first choice at a new state is the dice's: the
				// search spreads over the tree from its first runs on,
				// instead of reordering the end of one schedule first.
				ev := awake[dice.intn(len(awake))]
				n.tried = append(n.tried, ev.key)
				n.backtrack[ev.key] = true
				n.children[ev.key] = newChildPlaceholder(n, n.deviations, n.childSleep(ev.key))
				return ev
			}
			if len(enabled) > 0 {
				e.res.SleepBlocked++
			}
			return nil
		}
		analyse := func(enabled, faults []*explEvent, s *explSched) {
			depth := len(s.trace)
			all := append(slices.Clone(enabled), faults...)
			var n *explNode
			switch {
			case depth == 0 && root == nil:
				root = newExplNode(nil, 0, map[string]*explEvent{}, all)
				e.res.States++
				n = root
			case depth == 0:
				n = root
			default:
				parent := cur[depth-1]
				n = parent.children[s.trace[depth-1].ev.key]
				if n.events == nil {
					n.fill(all)
					e.res.States++
				}
			}
			cur = append(cur[:depth], n)
			for _, p := range all {
				addBacktrack(cur, s.trace, p, onBacktrack)
			}
		}
		out, err := e.runOnce(choose, analyse, e.cfg.Faults)
		if err != nil {
			return err
		}
		e.res.Runs++
		e.res.Steps += out.steps
		if diverged {
			e.res.Divergences++
		}
		if out.violation != nil {
			e.res.Violation = out.violation
			return nil
		}
		if e.cfg.Log != nil && e.res.Runs%200 == 0 {
			e.cfg.Log(fmt.Sprintf("%s: %d runs, %d states, %d schedules to run, %s", e.sc.name, e.res.Runs, e.res.States, len(todo),
				time.Since(start).Round(time.Second)))
		}
		target = nil
		for len(todo) > 0 {
			t := pop()
			if !t.at.wasTried(t.key) && t.at.sleep[t.key] == nil {
				target = &t
				break
			}
		}
		if target == nil {
			e.res.Finished = true
			return nil
		}
		if (e.cfg.MaxRuns > 0 && e.res.Runs >= e.cfg.MaxRuns) || (e.cfg.Budget > 0 && time.Since(start) > e.cfg.Budget) {
			return nil
		}
	}
}

func (t *explTodo) nodeOrNil() *explNode {
	if t == nil {
		return nil
	}
	return t.at
}

// childKey is the event that leads from n to its child c.
func (n *explNode) childKey(c *explNode) string {
	for k, ch := range n.children {
		if ch == c {
			return k
		}
	}
	return ""
}

// newChildPlaceholder is the state a choice leads to, before a run
// reaches it and fills in what is enabled there.
func newChildPlaceholder(parent *explNode, deviations int, sleep map[string]*explEvent) *explNode {
	return &explNode{parent: parent, depth: parent.depth + 1, deviations: deviations, sleep: sleep, backtrack: map[string]bool{},
		children: map[string]*explNode{}}
}

// fill records what is enabled at a state a run reached.
func (n *explNode) fill(enabled []*explEvent) {
	n.events = map[string]*explEvent{}
	for _, ev := range enabled {
		n.enabled = append(n.enabled, ev.key)
		n.events[ev.key] = ev.meta()
	}
}

// addBacktrack is the race analysis of one pending event p against the
// schedule so far (path are its states, trace its events): the last
// event dependent with p that p does not causally follow races with it,
// so the state before that event must also try p first (or, when p was
// not pending there yet, the event there that leads to it; failing that,
// everything).
func addBacktrack(path []*explNode, trace []explStep, p *explEvent, add func(*explNode, string)) {
	i := -1
	for j := len(trace) - 1; j >= 0; j-- {
		if trace[j].ev.dependent(p) && !p.issue.has(j) {
			i = j
			break
		}
	}
	if i < 0 || i >= len(path) {
		return
	}
	n := path[i]
	if n.has(p.key) {
		add(n, p.key)
		return
	}
	if p.kind == explFault {
		return // the budget was spent there
	}
	for j := i + 1; j < len(trace); j++ {
		if p.issue.has(j) && !trace[j].clock.has(i) && n.has(trace[j].ev.key) {
			add(n, trace[j].ev.key)
			return
		}
	}
	for _, k := range n.enabled {
		if n.events[k].kind != explFault {
			add(n, k)
		}
	}
}

// runOut is what one run did.
type runOut struct {
	steps     int
	violation *ExploreViolation
}

// runOnce runs the scenario once along choose, checking the invariants
// after every step; analyse (unless nil) sees every state before the
// choice.
func (e *explorer) runOnce(choose chooser, analyse func(enabled, faults []*explEvent, s *explSched), faultBudget int) (runOut, error) {
	dir, err := os.MkdirTemp(e.cfg.Dir, "run")
	if err != nil {
		return runOut{}, err
	}
	defer os.RemoveAll(dir)
	x, err := newExplRun(e.sc, dir)
	if err != nil {
		return runOut{}, err
	}
	defer x.close()
	if e.cfg.Trace != nil && !e.traced && !e.replaying {
		e.traced = true
		defer func() {
			var all []int
			for i := range x.s.trace {
				all = append(all, i)
			}
			for _, l := range x.traceLines(all) {
				e.cfg.Trace(l)
			}
		}()
	}
	x.start(e.sc.actors(x))
	var out runOut
	for depth := 0; ; depth++ {
		quiesce()
		if err := x.check(); err != nil {
			out.violation = e.violation(x, err)
			return out, nil
		}
		enabled := x.s.enabled()
		if len(enabled) == 0 && !x.finished() {
			enabled = x.waitForWork()
			if len(enabled) == 0 {
				e.res.Stuck++
				if e.cfg.Log != nil {
					e.cfg.Log("a run is stuck: an actor waits for something no event brings\n" + goroutines())
				}
			}
		}
		var faults []*explEvent
		if x.s.faults < faultBudget && len(enabled) > 0 {
			faults = x.s.faultEvents(e.sc.ctls, e.sc.faultNodes(x))
		}
		if analyse != nil {
			analyse(enabled, faults, x.s)
		}
		if depth >= e.cfg.MaxSteps {
			e.res.Capped++
			return out, nil
		}
		ev := choose(depth, enabled, faults, x.s)
		if ev == nil {
			return out, nil
		}
		x.s.execute(ev)
		out.steps++
	}
}

// waitForWork waits, in real time, for an event when none is pending
// but an actor still works: a goroutine of the system waits on a timer
// (a retry's pause). It gives up after a few seconds.
func (x *explRun) waitForWork() []*explEvent {
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) && !x.finished(); {
		time.Sleep(5 * time.Millisecond)
		quiesce()
		if ev := x.s.enabled(); len(ev) > 0 {
			return ev
		}
	}
	return nil
}

// violation records the run's schedule and trace, and the schedule cut
// to the violation's causal past, replayed.
func (e *explorer) violation(x *explRun, err error) *ExploreViolation {
	v := &ExploreViolation{Err: err}
	var all []int
	for i := range x.s.trace {
		all = append(all, i)
	}
	v.Trace = x.traceLines(all)
	v.Minimal = v.Trace
	if e.replaying {
		return v
	}
	if slice := causalSlice(x.s.trace, x.w.nodes); len(slice) < len(all) {
		if lines, ok := e.replaySlice(x.s.trace, slice); ok {
			v.Minimal = lines
		}
	}
	return v
}

// causalSlice is the last step and, for every node, the last step that
// changed it, with everything they causally follow: the fewest events of
// the schedule that leave every node as the schedule left it.
func causalSlice(trace []explStep, nodes []*simNode) []int {
	keep := map[int]bool{}
	take := func(i int) {
		keep[i] = true
		for j := range i {
			if trace[i].clock.has(j) {
				keep[j] = true
			}
		}
	}
	if len(trace) > 0 {
		take(len(trace) - 1)
	}
	for _, n := range nodes {
		for i := len(trace) - 1; i >= 0; i-- {
			if ev := trace[i].ev; ev.kind != explReply && !ev.read && touches(ev.nodes, n.id) {
				take(i)
				break
			}
		}
	}
	var out []int
	for i := range trace {
		if keep[i] {
			out = append(out, i)
		}
	}
	return out
}

// replaySlice runs the schedule's events in slice alone, in order, and
// returns the trace if it breaks an invariant.
func (e *explorer) replaySlice(trace []explStep, slice []int) ([]string, bool) {
	var keys []string
	for _, i := range slice {
		keys = append(keys, trace[i].ev.key)
	}
	choose := func(depth int, enabled, faults []*explEvent, s *explSched) *explEvent {
		if depth >= len(keys) {
			return nil
		}
		for _, ev := range append(slices.Clone(enabled), faults...) {
			if ev.key == keys[depth] {
				return ev
			}
		}
		return nil
	}
	sub := &explorer{cfg: e.cfg, sc: e.sc, replaying: true}
	out, err := sub.runOnce(choose, nil, len(keys))
	if err != nil || out.violation == nil {
		return nil, false
	}
	return out.violation.Trace, true
}

// random runs the random schedules of seeds first..last.
func (e *explorer) random(first, last uint64) error {
	for seed := first; seed <= last; seed++ {
		d := newDice(seed)
		choose := func(depth int, enabled, faults []*explEvent, s *explSched) *explEvent {
			if len(enabled) == 0 {
				return nil
			}
			if len(faults) > 0 && d.chance(0.03) {
				return faults[d.intn(len(faults))]
			}
			return enabled[d.intn(len(enabled))]
		}
		out, err := e.runOnce(choose, nil, e.cfg.RandomFaults)
		if err != nil {
			return err
		}
		e.res.RandomRuns++
		e.res.RandomSteps += out.steps
		if out.violation != nil {
			out.violation.Seed = seed
			e.res.Violation = out.violation
			return nil
		}
	}
	return nil
}
