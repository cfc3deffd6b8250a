package nomad

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Where the guest's CPU goes during a drain: the drain's length is
// mostly waiting for CPU in the emulated guest, and these figures say
// whose. The test runs in the guest's root namespaces, so /proc lists
// every simulated node's processes.

// cpuSample is the guest's CPU time so far: busy and total, and by
// command the time of its live processes and of the children they
// reaped (a node's zfs send and receive count to zfs-node, the nomad
// commands the test runs count to the test).
type cpuSample struct {
	busy, iowait, total time.Duration
	stalled             map[string]time.Duration // by resource: time some task waited for it (PSI)
	byPID               map[int]procCPU
}

type procCPU struct {
	comm string
	used time.Duration
}

const userHZ = 100 // /proc counts in 1/100 s

func sampleCPU() cpuSample {
	s := cpuSample{byPID: map[int]procCPU{}, stalled: map[string]time.Duration{}}
	if data, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(data), "\n")
		for i, f := range strings.Fields(line)[1:] {
			n, _ := strconv.ParseInt(f, 10, 64)
			d := time.Duration(n) * time.Second / userHZ
			s.total += d
			switch i {
			case 3: // idle
			case 4:
				s.iowait += d
			default:
				s.busy += d
			}
		}
	}
	for _, resource := range []string{"cpu", "io", "memory"} {
		s.stalled[resource] = pressureStalled(resource)
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		open, closing := strings.IndexByte(string(data), '('), strings.LastIndexByte(string(data), ')')
		if open < 0 || closing < open {
			continue
		}
		fields := strings.Fields(string(data)[closing+1:]) // from field 3, state
		if len(fields) < 15 {
			continue
		}
		var ticks int64
		for _, f := range fields[11:15] { // utime stime cutime cstime
			n, _ := strconv.ParseInt(f, 10, 64)
			ticks += n
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		s.byPID[pid] = procCPU{comm: role(pid, string(data)[open+1:closing]), used: time.Duration(ticks) * time.Second / userHZ}
	}
	return s
}

// pressureStalled is the time some task waited for resource, from the
// kernel's pressure stall information (zero where the kernel keeps none).
func pressureStalled(resource string) time.Duration {
	data, err := os.ReadFile("/proc/pressure/" + resource)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n") // "some avg10=... total=<µs>"
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "total="); ok {
			us, _ := strconv.ParseInt(v, 10, 64)
			return time.Duration(us) * time.Microsecond
		}
	}
	return 0
}

// role names a process by its command, and a nomad process by what it
// is too: the agents (one server, three clients) are the simulation's
// overhead, each new allocation's executor and log collector are the
// drain's own work.
func role(pid int, comm string) string {
	if comm != "nomad" {
		return comm
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return comm
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if len(args) < 2 {
		return comm
	}
	if args[1] == "agent" {
		for _, a := range args[2:] {
			if strings.Contains(a, "server") {
				return "nomad agent (server)"
			}
		}
		return "nomad agent (client)"
	}
	return "nomad " + args[1]
}

// cpuSince tells how busy the guest was since before and which commands
// used the most of it.
func cpuSince(before cpuSample) string {
	after := sampleCPU()
	by := map[string]time.Duration{}
	for pid, p := range after.byPID {
		by[p.comm] += p.used - before.byPID[pid].used // a new process counts whole
	}
	type use struct {
		comm string
		d    time.Duration
	}
	var uses []use
	for c, d := range by {
		if d > 0 {
			uses = append(uses, use{c, d})
		}
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].d > uses[j].d })
	busy, total := after.busy-before.busy, after.total-before.total
	var b strings.Builder
	fmt.Fprintf(&b, "guest CPU: %.0f s busy of %.0f s (%.0f%%), %.0f s waiting for I/O", busy.Seconds(), total.Seconds(), 100*busy.Seconds()/max(total.Seconds(), 1), (after.iowait - before.iowait).Seconds())
	for _, resource := range []string{"cpu", "io", "memory"} {
		fmt.Fprintf(&b, "; some task stalled on %s %.0f s", resource, (after.stalled[resource] - before.stalled[resource]).Seconds())
	}
	for i, u := range uses {
		if i == 12 {
			break
		}
		fmt.Fprintf(&b, "; %s %.0f s", u.comm, u.d.Seconds())
	}
	return b.String()
}

// pluginMemory tells the cgroup memory of each process named one of
// comms: Nomad makes a task's memory its hard limit (memory.max), which
// covers the zfs send and receive processes a node plugin runs; and its
// cgroup's CPU weight (from the task's cpu, Docker's CPU shares), which
// is its share of a busy CPU against its cgroup's siblings.
func pluginMemory(comms ...string) string {
	var out []string
	for pid, p := range sampleCPU().byPID {
		if !slices.Contains(comms, p.comm) {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			continue
		}
		_, cg, _ := strings.Cut(strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0]), "::")
		read := func(name string) string {
			v, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup", cg, name))
			return strings.Join(strings.Fields(string(v)), " ")
		}
		out = append(out, fmt.Sprintf("%s %d: memory.max %s, peak %s, events: %s; cgroup %s, cpu.weight %s, its parent's %s",
			p.comm, pid, read("memory.max"), read("memory.peak"), read("memory.events"), cg, read("cpu.weight"), read("../cpu.weight")))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
