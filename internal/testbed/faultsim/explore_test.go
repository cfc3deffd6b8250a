package faultsim

import (
	"flag"
	"strconv"
	"testing"
	"time"
)

var (
	exploreScenario = flag.String("explore-scenario", "", "explore only this scenario (TestExplorer, TestExplorerLong)")
	exploreFaults   = flag.Int("explore-faults", -1, "faults per run of the exhaustive search (default: the test's)")
	exploreBudget   = flag.Duration("explore-budget", 0, "time for each scenario's exhaustive search (default: the test's)")
	exploreRandom   = flag.Int("explore-random", -1, "random runs after each exhaustive search (default: the test's)")
	exploreSeed     = flag.Uint64("explore-seed", 0, "replay this random run (with -explore-scenario and -explore-faults), its trace in the log")
	exploreTrace    = flag.Bool("explore-trace", false, "log the trace of each scenario's first run")
	exploreLong     = flag.Bool("explore-long", false, "run TestExplorerLong: every scenario, one fault per run exhaustively, random runs with two")
)

// explorerRun is one scenario's exploration in a test, and its bound:
// faults per run in the exhaustive search, the time it may take, and
// random runs after it with up to randomFaults faults each.
type explorerRun struct {
	scenario     string
	faults       int
	budget       time.Duration
	random       int
	randomFaults int
}

// TestExplorer explores the classes' scenarios (explore_scenarios.go)
// exhaustively: every interleaving of their calls up to the order of
// independent ones, without faults for class 1's (with one, its search
// takes minutes: TestExplorerLong) and with one fault per run (a
// controller instance's crash or the cut of one of its links, at any
// step) for the others'; then random schedules, with faults where the
// exhaustive search had them. About 70 s on two cores, 110 s at most
// (the budgets). It fails on any violation, with its minimal trace and
// the command that replays it.
func TestExplorer(t *testing.T) {
	runExplorer(t, []explorerRun{
		{scenario: "move-beside-publish-back", budget: 45 * time.Second, random: 30},
		{scenario: "aliased-peers", faults: 1, budget: 10 * time.Second, random: 20, randomFaults: 2},
		{scenario: "forced-outlives-its-minority", faults: 1, budget: 10 * time.Second, random: 20, randomFaults: 2},
		{scenario: "flush-beside-move", faults: 1, budget: 10 * time.Second, random: 20, randomFaults: 2},
		{scenario: "move-over-a-broken-link", faults: 1, budget: 10 * time.Second, random: 20, randomFaults: 2},
		{scenario: "witness-majority-cut-off", faults: 1, budget: 10 * time.Second, random: 20, randomFaults: 2},
		{scenario: "move-beside-publish-back-witnesses", budget: 15 * time.Second, random: 20},
	})
}

// TestExplorerLong is the longer run (-explore-long): every scenario, one
// fault per run in the exhaustive search, then 500 random schedules with
// up to two.
func TestExplorerLong(t *testing.T) {
	if !*exploreLong {
		t.Skip("the long exploration runs with -explore-long")
	}
	var runs []explorerRun
	for _, name := range scenarioNames() {
		runs = append(runs, explorerRun{scenario: name, faults: 1, budget: 10 * time.Minute, random: 500, randomFaults: 2})
	}
	runExplorer(t, runs)
}

func runExplorer(t *testing.T, runs []explorerRun) {
	for _, r := range runs {
		if *exploreScenario != "" && r.scenario != *exploreScenario {
			continue
		}
		t.Run(r.scenario, func(t *testing.T) {
			cfg := ExploreConfig{Scenario: r.scenario, Faults: r.faults, Budget: r.budget, RandomRuns: r.random, RandomSeed: 1,
				RandomFaults: r.randomFaults, Dir: t.TempDir(), Seed: *exploreSeed, Log: func(s string) { t.Log(s) }}
			if *exploreFaults >= 0 {
				cfg.Faults, cfg.RandomFaults = *exploreFaults, *exploreFaults+1
			}
			if *exploreBudget > 0 {
				cfg.Budget = *exploreBudget
			}
			if *exploreTrace {
				cfg.Trace = func(s string) { t.Log(s) }
			}
			if *exploreRandom >= 0 {
				cfg.RandomRuns = *exploreRandom
			}
			t.Log(explScenarios[r.scenario].about)
			res, err := Explore(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res)
			if res.Stuck+res.Capped > 0 {
				t.Errorf("%d runs stuck (an actor waited with no event pending) and %d capped at %d steps: the explorer does not cover what it claims",
					res.Stuck, res.Capped, explMaxSteps)
			}
			if v := res.Violation; v != nil {
				if cfg.Seed != 0 {
					for _, l := range v.Trace {
						t.Log(l)
					}
				}
				t.Fatalf("%s\n  replay: go test ./internal/testbed/faultsim -run '%s' -v -args -explore-scenario=%s -explore-faults=%d%s%s", v,
					t.Name()[:len(t.Name())-len(r.scenario)-1], r.scenario, cfg.Faults, replaySeed(v), map[bool]string{true: " -explore-long"}[*exploreLong])
			}
		})
	}
}

func replaySeed(v *ExploreViolation) string {
	if v.Seed == 0 {
		return ""
	}
	return " -explore-seed=" + strconv.FormatUint(v.Seed, 10)
}
