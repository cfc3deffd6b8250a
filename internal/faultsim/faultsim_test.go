package faultsim

import (
	"errors"
	"flag"
	"os"
	"strconv"
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
// that replays it.
func TestSimulation(t *testing.T) {
	first, n := *firstFlag, seeds()
	if *seedFlag != 0 {
		first, n = *seedFlag, 1
	}
	start := time.Now()
	var total Stats
	for seed := first; seed < first+uint64(n); seed++ {
		cfg := DefaultConfig(seed)
		cfg.Dir = t.TempDir()
		if *stepsFlag > 0 {
			cfg.Steps = *stepsFlag
		}
		if *downFlag > 0 {
			cfg.MaxProcessDowntime = *downFlag
		}
		if *seedFlag != 0 && testing.Verbose() {
			cfg.Trace = func(line string) { t.Log(line) }
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
	// A run that exercised nothing proves nothing.
	if n >= 50 && (total.NewGeneration == 0 || total.StaleRefused == 0 || total.ReadOnly == 0 || total.Deletes == 0 || total.Crashes == 0) {
		t.Errorf("the seeds did not exercise every kind of event: %+v", total)
	}
}
