//go:build linux

package mount

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// maxHolders bounds what Holders reports: enough to name the culprit.
const maxHolders = 5

// Holders names the processes, one per mount namespace, that see ZFS
// dataset mounted, read from procDir (/proc): "pid 812 (sleep) at
// /data". A dataset the node unmounted can still be busy in another
// namespace (a task's, which Nomad's exec driver makes), and zfs destroy
// then answers only EBUSY; this says where. Best effort: processes that
// end meanwhile or cannot be read are passed over.
func Holders(procDir, dataset string) []string {
	pids, _ := filepath.Glob(filepath.Join(procDir, "[0-9]*"))
	sort.Slice(pids, func(i, j int) bool { return pidOf(pids[i]) < pidOf(pids[j]) })
	seen := map[string]bool{}
	var out []string
	for _, dir := range pids {
		ns, err := os.Readlink(filepath.Join(dir, "ns", "mnt"))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		entries, err := tableAt(filepath.Join(dir, "mountinfo"))
		if err != nil {
			continue
		}
		e, ok := zfsMount(entries, dataset)
		if !ok {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
		out = append(out, fmt.Sprintf("pid %s (%s) at %s", filepath.Base(dir), strings.TrimSpace(string(comm)), e.MountPoint))
		if len(out) == maxHolders {
			break
		}
	}
	return out
}

func pidOf(dir string) int {
	pid, _ := strconv.Atoi(filepath.Base(dir))
	return pid
}
