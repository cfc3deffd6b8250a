package bench

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guesttest"
)

var (
	idleVolumes = flag.Int("idle-volumes", 6, "replicated volumes BenchmarkIdle's cluster holds")
	idleWindow  = flag.Duration("idle-window", time.Minute, "how long BenchmarkIdle measures each case")
)

// BenchmarkIdle is what a settled cluster costs when nothing happens:
// three nodes with the shipped defaults (peers and a 30 s lease, the
// controller's 30 s schedule), -idle-volumes volumes with one replica
// each, measured over -idle-window once unscraped and once with every
// node and the controller scraped every 15 s, as Prometheus would. It
// reports each process's CPU time (its own, and its children's: zfs
// send and receive, zpool list) as a share of one vCPU, beside the whole
// guest's. Under TCG every figure is many times a real CPU's; the
// shares between processes, and between cases, are what carry over.
func BenchmarkIdle(b *testing.B) {
	lease := time.Duration(config.DefaultNode().Lease)
	c := guesttest.StartCluster(b, 3, guestcluster.Options{LogLevel: "info", Lease: lease})
	ctl := controllerClient(b, c)
	for i := range *idleVolumes {
		_, err := ctl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: fmt.Sprintf("idle-%d", i),
			CapacityRange: &csi.CapacityRange{RequiredBytes: 256 << 20}, VolumeCapabilities: []*csi.VolumeCapability{mountCapability},
			Parameters: map[string]string{"node": c.Nodes[i%len(c.Nodes)].ID, "replicas": "1"}})
		if err != nil {
			b.Fatal(err)
		}
	}
	settle(b, c, 2**idleVolumes)
	for _, every := range []time.Duration{0, 15 * time.Second} {
		name := "unscraped"
		if every > 0 {
			name = "scraped every " + every.String()
		}
		procs := processTimes(b)
		guest := measure(b, func() { scrapeFor(c, *idleWindow, every) })
		after := processTimes(b)
		shareOfOneVCPU := func(d time.Duration) float64 { return 100 * d.Seconds() / guest.wall.Seconds() }
		var lines []string
		for _, pid := range slices.Sorted(maps.Keys(after)) {
			p, was := after[pid], procs[pid]
			lines = append(lines, fmt.Sprintf("%s (pid %d): %.1f %% own, %.1f %% children", p.name, pid, shareOfOneVCPU(p.own-was.own), shareOfOneVCPU(p.children-was.children)))
		}
		b.Logf("FIGURE idle, %s, %d volumes with a replica, lease %s: the guest %.1f %% of one vCPU busy (of %d); %s",
			name, *idleVolumes, lease, shareOfOneVCPU(guest.cpu), runtime.NumCPU(), strings.Join(lines, "; "))
	}
}

// settle waits until the nodes hold want volume datasets in all
// (primaries and replicas): the schedule's first pushes are done.
func settle(b *testing.B, c *guestcluster.Cluster, want int) {
	b.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		held := 0
		for _, n := range c.Nodes {
			out := sh(b, "zfs list -H -o name -t filesystem -d 1 "+n.RootDataset)
			held += strings.Count(out, "/vol-")
		}
		if held >= want {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d volume datasets on the nodes after 3 min, want %d: the schedule did not replicate them", held, want)
		}
		time.Sleep(2 * time.Second)
	}
}

// scrapeFor waits d, reading every node's and the controller's metrics
// each every (never when 0).
func scrapeFor(c *guestcluster.Cluster, d, every time.Duration) {
	if every == 0 {
		time.Sleep(d)
		return
	}
	targets := []string{c.ControllerMetrics}
	for _, n := range c.Nodes {
		targets = append(targets, n.Metrics)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(every) {
		for _, t := range targets {
			if resp, err := client.Get(t); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}
}

// processTime is a driver process's CPU time so far: its own, and its
// waited-for children's.
type processTime struct {
	name          string
	own, children time.Duration
}

// processTimes reads the CPU times of every zfs-node and zfs-controller
// process in the guest, by pid.
func processTimes(b *testing.B) map[int]processTime {
	b.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		b.Fatal(err)
	}
	out := map[int]processTime{}
	for _, dir := range dirs {
		comm, err := os.ReadFile(dir + "/comm")
		name := strings.TrimSpace(string(comm))
		if err != nil || (name != "zfs-node" && name != "zfs-controller") {
			continue
		}
		stat, err := os.ReadFile(dir + "/stat")
		if err != nil {
			continue // gone meanwhile
		}
		// The fields after the command's closing parenthesis: utime,
		// stime, cutime and cstime are the 12th to the 15th of them.
		_, rest, _ := strings.Cut(string(stat), ") ")
		f := strings.Fields(rest)
		if len(f) < 15 {
			b.Fatalf("%s/stat: too few fields: %q", dir, stat)
		}
		ticks := func(i int) time.Duration {
			t, err := userTicks(f[i])
			if err != nil {
				b.Fatalf("%s/stat: %v", dir, err)
			}
			return t
		}
		pid, _ := strconv.Atoi(filepath.Base(dir))
		out[pid] = processTime{name: name, own: ticks(11) + ticks(12), children: ticks(13) + ticks(14)}
	}
	return out
}
