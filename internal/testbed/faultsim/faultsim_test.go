package faultsim

import (
	"errors"
	"flag"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	seedFlag  = flag.Uint64("seed", 0, "run only this seed (replay a failure)")
	seedsFlag = flag.Int("seeds", 0, "how many seeds to run (default: "+strconv.Itoa(defaultSeeds)+", or $ZFS_NOMAD_SIM_SEEDS)")
	firstFlag = flag.Uint64("first-seed", 1, "the first seed of the range")
	stepsFlag = flag.Int("steps", 0, "steps per seed (default: DefaultConfig's)")
	downFlag  = flag.Int("max-downtime", 0, "longest a crashed node process stays down, in steps (default: DefaultConfig's)")
	goOnFlag  = flag.Bool("keep-going", false, "run every seed and list the failing ones, instead of stopping at the first")
	nodesFlag = flag.Int("nodes", 0, "nodes per run (default: DefaultConfig's)")
	volsFlag  = flag.Int("volumes", 0, "volumes per run (default: DefaultConfig's)")
	domsFlag  = flag.Int("domains", 0, "replication domains per run (default: DefaultConfig's)")
	skewFlag  = flag.Duration("skew", -1, "largest offset of a node's wall clock (default: DefaultConfig's)")
	liesFlag  = flag.Bool("lying-peers", false, "let nodes' certificate holders send forged streams")
	ctlsFlag  = flag.Int("controllers", 0, "controller instances per run (default: DefaultConfig's, one)")
	aliasFlag = flag.Bool("aliases", false, "give every node a second address, and list about half the nodes under both")
	forceFlag = flag.Bool("force", false, "let the operator run promote -force where its guarantee holds")
	witsFlag  = flag.String("witnesses", "", "the witness set's nodes, comma separated (n1,n2,n4): the leases and a generation's majorities count them only")
	logsFlag  = flag.Bool("logs", false, "with -seed and -v: the nodes' and the controller's logs beside the trace")
)

// defaultSeeds is what make test runs: about three minutes on two cores.
const defaultSeeds = 1000

func seeds() int {
	if *seedsFlag > 0 {
		return *seedsFlag
	}
	if n, err := strconv.Atoi(os.Getenv("ZFS_NOMAD_SIM_SEEDS")); err == nil && n > 0 {
		return n
	}
	return defaultSeeds
}

// TestSimulation runs the seeds; each one's failure names the command
// that replays it. The shapes' tests run side by side (t.Parallel, as
// many at once as go test's -parallel, GOMAXPROCS by default): one
// seed's world keeps about one core busy, and each seed is a world of
// its own (its nodes, pools, clocks and CO), so two at once use a 2-core
// machine fully. A seed's steps are the same either way; the background
// work that runs in real time beside them meets them at other moments,
// as on any loaded machine.
func TestSimulation(t *testing.T) {
	t.Parallel()
	runSeeds(t, seeds(), func(*Config) {})
}

// TestSimulationFiveNodes runs half as many seeds on five nodes with
// three volumes in two replication domains (n1-n3, n4-n5): majorities of
// three across the domains, copies on nodes a volume never lived on,
// more links to cut, and splits shaped by the domains (a majority of one
// domain cut off from the rest, a minority of all: split.go), which need
// the seeds to meet a job, a replica and a failover. Every node has a
// second address, the nodes' peer lists name about half the nodes under
// both and the controller's two of them (Config.Aliases): two of five
// listed twice would make a majority of addresses out of a minority of
// nodes. Replay a failure with -run
// 'TestSimulation$' -seed N -nodes 5 -volumes 3 -domains 2 -aliases -v.
func TestSimulationFiveNodes(t *testing.T) {
	t.Parallel()
	if *seedFlag != 0 || *nodesFlag != 0 {
		t.Skip("a replay or a chosen shape runs in TestSimulation")
	}
	runSeeds(t, max(seeds()/2, 1), func(cfg *Config) { cfg.Nodes, cfg.Volumes, cfg.Domains, cfg.Aliases = 5, 3, 2, true })
}

// TestSimulationLyingPeers runs half as many seeds with lying peers:
// forged streams from a node's certificate holder, and streams it stalls,
// on a split's cut side among others (liar.go). Half, not a fifth: a
// receiver that took a copy's lock on a stalled header (docs/safety.md,
// "A receive and the lock") fails seed 247 alone, which a fifth of the
// seeds misses.
// Replay a failure with -run 'TestSimulation$' -seed N -lying-peers -v.
func TestSimulationLyingPeers(t *testing.T) {
	t.Parallel()
	if *seedFlag != 0 || *liesFlag {
		t.Skip("a replay or a chosen shape runs in TestSimulation")
	}
	runSeeds(t, max(seeds()/2, 1), func(cfg *Config) { cfg.LyingPeers = true })
}

// TestSimulationSeveralControllers runs half as many seeds with two
// controller instances and a quarter with three: the CO sends each call
// to any of them, any of them crashes in the middle of a publish, a
// split puts each on either side, and the one that holds the work lease
// runs the schedule and the pass over deletions; at most one may hold
// it at any step. Replay a failure with -run 'TestSimulation$' -seed N
// -controllers 2 -v.
func TestSimulationSeveralControllers(t *testing.T) {
	t.Parallel()
	if *seedFlag != 0 || *ctlsFlag != 0 {
		t.Skip("a replay or a chosen shape runs in TestSimulation")
	}
	t.Run("two", func(t *testing.T) {
		runSeeds(t, max(seeds()/2, 1), func(cfg *Config) { cfg.Controllers = 2 })
	})
	t.Run("three", func(t *testing.T) {
		runSeeds(t, max(seeds()/4, 1), func(cfg *Config) { cfg.Controllers = 3 })
	})
}

// TestSimulationForced runs a quarter as many seeds of the default shape
// with the operator's promote -force where its guarantee holds
// (forcePromote), and the nodes it declares lost coming back only with
// their copies set aside (declareLost). Its own shape, so that the other
// shapes' draws stay as they were. Replay a failure with -run
// 'TestSimulation$' -seed N -force -v.
func TestSimulationForced(t *testing.T) {
	t.Parallel()
	if *seedFlag != 0 || *forceFlag {
		t.Skip("a replay or a chosen shape runs in TestSimulation")
	}
	runSeeds(t, max(seeds()/4, 1), func(cfg *Config) { cfg.ForcePromotions = true })
}

// TestSimulationWitnesses runs half as many seeds on five nodes in two
// domains (n1-n3, n4-n5) with three witnesses across them (n1, n2, n4):
// the leases and a generation's majorities count the witnesses only,
// and half the splits cut off a majority of the witnesses with the job's
// node, a minority of all nodes, where a failover counted over all nodes
// would meet a lease that still holds (cutSide). Replay a failure with
// -run 'TestSimulation$' -seed N -nodes 5 -volumes 3 -domains 2
// -witnesses n1,n2,n4 -v.
func TestSimulationWitnesses(t *testing.T) {
	t.Parallel()
	if *seedFlag != 0 || *witsFlag != "" {
		t.Skip("a replay or a chosen shape runs in TestSimulation")
	}
	runSeeds(t, max(seeds()/2, 1), func(cfg *Config) {
		cfg.Nodes, cfg.Volumes, cfg.Domains, cfg.Witnesses = 5, 3, 2, []string{"n1", "n2", "n4"}
	})
}

// runSeeds runs n seeds from -first-seed (or the one -seed), each shaped
// by shape and then by the flags.
func runSeeds(t *testing.T, n int, shape func(*Config)) {
	first := *firstFlag
	if *seedFlag != 0 {
		first, n = *seedFlag, 1
	}
	start := time.Now()
	var total Stats
	for seed := first; seed < first+uint64(n); seed++ {
		cfg := DefaultConfig(seed)
		shape(&cfg)
		cfg.Dir = t.TempDir()
		if *stepsFlag > 0 {
			cfg.Steps = *stepsFlag
		}
		if *downFlag > 0 {
			cfg.MaxProcessDowntime = *downFlag
		}
		if *nodesFlag > 0 {
			cfg.Nodes = *nodesFlag
		}
		if *volsFlag > 0 {
			cfg.Volumes = *volsFlag
		}
		if *domsFlag > 0 {
			cfg.Domains = *domsFlag
		}
		if *skewFlag >= 0 {
			cfg.Skew = *skewFlag
		}
		if *liesFlag {
			cfg.LyingPeers = true
		}
		if *ctlsFlag > 0 {
			cfg.Controllers = *ctlsFlag
		}
		if *aliasFlag {
			cfg.Aliases = true
		}
		if *forceFlag {
			cfg.ForcePromotions = true
		}
		if *witsFlag != "" {
			cfg.Witnesses = strings.Split(*witsFlag, ",")
		}
		if *seedFlag != 0 && testing.Verbose() {
			cfg.Trace = func(line string) { t.Log(line) }
			cfg.Verbose = *logsFlag
		}
		stats, err := Run(cfg)
		total.Add(stats)
		if err == nil {
			continue
		}
		var f *Failure
		if !errors.As(err, &f) {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if !*goOnFlag {
			t.Fatalf("%v", f)
		}
		t.Errorf("seed %d, step %d: %v", f.Seed, f.Step, f.Err)
	}
	t.Logf("%d seeds of %d steps in %s: %+v", n, DefaultConfig(0).Steps, time.Since(start).Round(time.Millisecond), total)
	// A run that exercised nothing proves nothing. A snapshot deleted
	// while copies of it sit on nodes out of reach is rare in the witness
	// shape (none in seeds 1 to 1,000, 12 in 2,000 from 30001), and its rules count
	// every node, witnesses or not: the other shapes cover it.
	lied := DefaultConfig(0)
	shape(&lied)
	lied.ForcePromotions = lied.ForcePromotions || *forceFlag
	if n >= 50 && (total.NewGeneration == 0 || total.StaleRefused == 0 || total.AheadStages == 0 || total.ReadOnly == 0 || total.Deletes == 0 || total.Crashes == 0 ||
		total.Snapshots == 0 || total.SnapshotDeletes == 0 || total.Restores == 0 || total.Expands == 0 ||
		n >= 1000 && total.Promotions == 0 || lied.ForcePromotions && total.ForcedPromotions == 0 || total.ReplicasRemoved == 0 ||
		lied.LyingPeers && (total.LiesRefused == 0 || total.Stalls == 0 || total.RollbacksRefused == 0 || total.ForgedNames == 0) || total.NamedCommands == 0 ||
		total.WorkLeaseHeld == 0 || lied.Controllers > 1 && total.WorkLeaseHandovers == 0 || n >= 500 && len(lied.Witnesses) == 0 && total.DeletedCopiesHidden == 0 || total.SettledRestores == 0 || n >= 500 && total.DeletedInFlight == 0) {
		t.Errorf("the seeds did not exercise every kind of event: %+v", total)
	}
}

// TestReplaysRepeatTheirRun: a seed run twice gives the same trace, so a
// failing seed's replay shows what failed. Lines are compared as sets of
// words, sorted within a step (byStep): the order of a fan-out's answers
// within an error message follows its goroutines. Three sources of
// difference remain, all in timing the seed does not fix: the agent
// client asks again once a dropped connection is back (cluster.Ask); a
// controller crash cuts a fan-out wherever its racing calls happen to be
// (so those are off here); and a move runs in the background, as
// shipped, in real time beside the steps, so where its calls meet the
// step's faults varies. Measured 2026-11-27: 13 and 14 of 30 seeds replay
// line for line (23 to 27 before moves ran in the background), the
// others part somewhere after the start. The test requires a third, so
// it fails only when replays really broke.
func TestReplaysRepeatTheirRun(t *testing.T) {
	const seeds = 30
	same := 0
	for seed := uint64(1); seed <= seeds; seed++ {
		var runs [2][]string
		for i := range runs {
			cfg := DefaultConfig(seed)
			cfg.ControllerCrashes = false
			cfg.Dir = t.TempDir()
			cfg.Trace = func(line string) { runs[i] = append(runs[i], line) }
			if _, err := Run(cfg); err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		if i := firstDifference(byStep(runs[0]), byStep(runs[1])); i >= 0 {
			t.Logf("seed %d: the replay parts at line %d of %d", seed, i, len(runs[0]))
			continue
		}
		same++
	}
	t.Logf("%d of %d seeds replayed exactly", same, seeds)
	if same < seeds/3 {
		t.Errorf("only %d of %d seeds replayed exactly, want at least a third", same, seeds)
	}
}

// firstDifference returns the first line at which a and b differ, or -1.
func firstDifference(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// byStep returns the lines as sets of words, sorted within each step:
// the background work (a move's catch-up and final step) traces as it
// goes, between the CO's lines of the step it runs in.
func byStep(lines []string) []string {
	var out []string
	for start := 0; start < len(lines); {
		step, _, _ := strings.Cut(lines[start], "]")
		end := start
		for end < len(lines) && strings.HasPrefix(lines[end], step+"]") {
			out = append(out, wordsOf(lines[end]))
			end++
		}
		slices.Sort(out[len(out)-(end-start):])
		start = end
	}
	return out
}

// wordsOf returns a line's words, sorted, as one string.
func wordsOf(line string) string {
	words := strings.Fields(strings.NewReplacer(";", " ", ",", " ", "(", " ", ")", " ").Replace(line))
	slices.Sort(words)
	return strings.Join(words, " ")
}
