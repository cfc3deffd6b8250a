//go:build linux

package mount

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestHolders(t *testing.T) {
	const dataset = "tank/nomad/vol-0123456789abcdef0123"
	line := func(id, at, source string) string {
		return id + " 1 0:52 / " + at + " rw,relatime shared:1 - zfs " + source + " rw,xattr,posixacl\n"
	}
	proc := t.TempDir()
	process := func(pid, comm, ns, mountinfo string) {
		dir := filepath.Join(proc, pid)
		if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("mnt:["+ns+"]", filepath.Join(dir, "ns", "mnt")); err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string]string{"comm": comm + "\n", "mountinfo": mountinfo} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	process("1", "init", "1", line("20", "/", "rpool/ROOT"))
	process("812", "sleep", "2", line("30", "/data", dataset))
	process("813", "sh", "2", line("30", "/data", dataset)) // the same namespace: named once
	process("900", "other", "3", line("40", "/other", dataset+"-deleted-1"))

	got := Holders(proc, dataset)
	want := []string{"pid 812 (sleep) at /data"}
	if !slices.Equal(got, want) {
		t.Errorf("Holders = %q, want %q", got, want)
	}
	if got := Holders(proc, "tank/nomad/vol-none"); len(got) != 0 {
		t.Errorf("Holders of a dataset mounted nowhere = %q", got)
	}
}
