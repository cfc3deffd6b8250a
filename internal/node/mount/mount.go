//go:build linux

// Package mount mounts ZFS datasets and bind mounts with mount(2) directly,
// reading the kernel's mount table (/proc/self/mountinfo) to stay
// idempotent: every function succeeds when its work is already done.
package mount

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Entry is one line of /proc/self/mountinfo.
type Entry struct {
	Root       string // the path inside the source that is mounted ("/" for a whole filesystem)
	MountPoint string
	Options    string // per-mount options (ro, nosuid, ...)
	FSType     string
	Source     string // for zfs: the dataset name
}

// Lookup returns the topmost mount at path, if any.
func Lookup(path string) (Entry, bool, error) {
	entries, err := Table()
	if err != nil {
		return Entry{}, false, err
	}
	var found Entry
	ok := false
	for _, e := range entries {
		if e.MountPoint == path {
			found, ok = e, true // later lines are mounted on top
		}
	}
	return found, ok, nil
}

// Table reads /proc/self/mountinfo.
func Table() ([]Entry, error) { return tableAt("/proc/self/mountinfo") }

// tableAt reads the mount table at path (a /proc/<pid>/mountinfo).
func tableAt(path string) ([]Entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Entry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		e, err := ParseMountInfoLine(sc.Text())
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// IsMountedZFS reports whether dataset is mounted anywhere in this mount
// namespace.
func IsMountedZFS(dataset string) (bool, error) {
	entries, err := Table()
	if err != nil {
		return false, err
	}
	_, ok := zfsMount(entries, dataset)
	return ok, nil
}

// zfsMount returns the first of entries that mounts ZFS dataset.
func zfsMount(entries []Entry, dataset string) (Entry, bool) {
	for _, e := range entries {
		if e.FSType == "zfs" && e.Source == dataset {
			return e, true
		}
	}
	return Entry{}, false
}

// ParseMountInfoLine parses one line of /proc/self/mountinfo (proc(5)).
func ParseMountInfoLine(line string) (Entry, error) {
	fields := strings.Fields(line)
	sep := -1
	for i := 6; i < len(fields); i++ {
		if fields[i] == "-" {
			sep = i
			break
		}
	}
	if len(fields) < 10 || sep < 0 || sep+2 >= len(fields) {
		return Entry{}, fmt.Errorf("unexpected mountinfo line %q", line)
	}
	return Entry{
		Root:       unescape(fields[3]),
		MountPoint: unescape(fields[4]),
		Options:    fields[5],
		FSType:     fields[sep+1],
		Source:     unescape(fields[sep+2]),
	}, nil
}

// unescape undoes the octal escapes (\040 for space) of mountinfo.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// HasOption reports whether a mount option list holds opt.
func (e Entry) HasOption(opt string) bool {
	for _, o := range strings.Split(e.Options, ",") {
		if o == opt {
			return true
		}
	}
	return false
}

// Flags turns mount flag names (already checked against the operator's
// allowlist) into mount(2) flags.
func Flags(names []string) (uintptr, error) {
	var flags uintptr
	for _, n := range names {
		f, ok := flagBits[n]
		if !ok {
			return 0, fmt.Errorf("unsupported mount flag %q", n)
		}
		flags |= f
	}
	return flags, nil
}

var flagBits = map[string]uintptr{
	"ro": unix.MS_RDONLY, "rw": 0, "noatime": unix.MS_NOATIME, "relatime": unix.MS_RELATIME,
	"strictatime": unix.MS_STRICTATIME, "nodiratime": unix.MS_NODIRATIME, "nodev": unix.MS_NODEV,
	"nosuid": unix.MS_NOSUID, "noexec": unix.MS_NOEXEC, "sync": unix.MS_SYNCHRONOUS, "dirsync": unix.MS_DIRSYNC,
}

// ZFS mounts dataset (mountpoint=legacy) at target with flags.
func ZFS(dataset, target string, flags uintptr) error {
	if err := os.MkdirAll(target, 0o750); err != nil {
		return fmt.Errorf("creating mount point: %w", err)
	}
	if err := unix.Mount(dataset, target, "zfs", flags, ""); err != nil {
		return fmt.Errorf("mount -t zfs %s %s: %w", dataset, target, err)
	}
	return nil
}

// Bind bind-mounts source at target and applies flags (a bind mount ignores
// flags until remounted).
func Bind(source, target string, flags uintptr) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mount --bind %s %s: %w", source, target, err)
	}
	if flags != 0 {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
			_ = unix.Unmount(target, 0)
			return fmt.Errorf("remounting %s with flags: %w", target, err)
		}
	}
	return nil
}

// Unmount unmounts everything mounted at target; nothing mounted is fine.
func Unmount(target string) error {
	for i := 0; i < 16; i++ { // stacked mounts come off one at a time
		_, mounted, err := Lookup(target)
		if err != nil || !mounted {
			return err
		}
		if err := unix.Unmount(target, 0); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("umount %s: %w", target, err)
		}
	}
	return fmt.Errorf("umount %s: still mounted after 16 unmounts", target)
}

// Stats returns filesystem usage at path.
type Stats struct {
	TotalBytes, AvailableBytes, UsedBytes int64
	TotalInodes, FreeInodes, UsedInodes   int64
}

// Statfs reads usage of the filesystem mounted at path.
func Statfs(path string) (Stats, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return Stats{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := int64(st.Bsize)
	return Stats{
		TotalBytes:     int64(st.Blocks) * bs,
		AvailableBytes: int64(st.Bavail) * bs,
		UsedBytes:      int64(st.Blocks-st.Bfree) * bs,
		TotalInodes:    int64(st.Files),
		FreeInodes:     int64(st.Ffree),
		UsedInodes:     int64(st.Files - st.Ffree),
	}, nil
}
