package nomad

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
)

// What Nomad's agents log during a drain: three client agents used as
// much CPU as the node plugins with their transfers (docs/migration.md),
// and at the DEBUG level the test runs them with, what they log says
// what they were busy with.

// logOffsets are the sizes of the agents' logs, to read what they wrote
// since.
type logOffsets map[*guestcluster.Process]int64

func (e *e2e) logOffsets() logOffsets {
	out := logOffsets{}
	for _, p := range e.procs {
		if fi, err := os.Stat(p.Log); err == nil {
			out[p] = fi.Size()
		}
	}
	return out
}

// logActivity tells, for each agent, how much it logged since before and
// its most frequent messages (level, module and message, without the
// key-value pairs).
func logActivity(before logOffsets) string {
	var b strings.Builder
	for p, offset := range before {
		text, err := readFrom(p.Log, offset)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
		counts := map[string]int{}
		for _, l := range lines {
			counts[messageOf(l)]++
		}
		type count struct {
			msg string
			n   int
		}
		var top []count
		for m, n := range counts {
			top = append(top, count{m, n})
		}
		sort.Slice(top, func(i, j int) bool { return top[i].n > top[j].n })
		fmt.Fprintf(&b, "\n  %s: %d lines, %d KiB", p.Name, len(lines), len(text)>>10)
		for i, c := range top {
			if i == 6 {
				break
			}
			fmt.Fprintf(&b, "\n    %5d  %.150s", c.n, c.msg)
		}
	}
	return b.String()
}

// messageOf is a log line without its time and key-value pairs.
func messageOf(line string) string {
	fields := strings.Fields(line)
	if len(fields) > 0 && strings.Contains(fields[0], "T") && strings.HasSuffix(fields[0], "Z") {
		fields = fields[1:]
	}
	for i, f := range fields {
		if strings.Contains(f, "=") {
			fields = fields[:i]
			break
		}
	}
	return strings.Join(fields, " ")
}

func readFrom(path string, offset int64) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return "", err
	}
	data, err := io.ReadAll(f)
	return string(data), err
}
