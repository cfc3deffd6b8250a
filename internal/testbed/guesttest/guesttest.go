// Package guesttest runs a package's tests where real ZFS is.
//
// A test package that needs ZFS calls Main from its TestMain. On a host with
// /dev/zfs the tests run directly. Otherwise Main builds the binaries the
// tests need, copies the test binary into a share directory, boots the ZFS
// guest (guest/run.sh) with the repository mounted read-only at the same
// path, reruns itself inside with the same flags and relays the output and
// exit status, so `go test` prints ordinary PASS/FAIL lines.
//
//	host: go test ./internal/node/zfs/libzfs
//	        └─ pkg.test (no /dev/zfs) ── guest/run.sh ── QEMU
//	                                                     └─ pkg.test (ZFS_NOMAD_IN_GUEST=1)
//
// Set ZFS_NOMAD_SKIP_GUEST=1 to skip such packages on a host without ZFS
// (make unit does); make test never sets it. ZFS_NOMAD_GUEST_CPU=DIR
// writes where each package's guest CPU time went to DIR (cputime.go).
//
// ZFS_NOMAD_GUEST picks the guest's Debian release and with it its OpenZFS
// (bookworm, 2.1, the default; trixie, 2.3). The binaries are built for
// that release's libzfs (hack/gobuild.sh), and a test binary that links
// libzfs itself is rebuilt for it too, since the host's would not load
// there.
package guesttest

import (
	"cmp"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/shared/config"
	"github.com/zfs-nomad/zfs-nomad/internal/testbed/guestcluster"
)

// DriverBinaries are the driver's two programs, for Options.Binaries.
func DriverBinaries() map[string]string {
	return map[string]string{"zfs-node": "./cmd/zfs-node", "zfs-controller": "./cmd/zfs-controller"}
}

// Options say what a package's guest run needs.
type Options struct {
	// Disks are the sizes of the guest's virtio disks (/dev/vda, ...),
	// those of one cluster slot when Slots is more than one.
	Disks []string
	// Slots is how many of the package's clusters (StartCluster) may run
	// at once, in parallel tests (t.Parallel): each slot has the Disks
	// of its own, after the previous slot's, and its own network
	// (guestcluster.Options.Slot). Zero means one.
	Slots int
	// Binaries maps a name to a main package path ("./cmd/zfs-node")
	// built for the guest; BinPath(name) finds it inside.
	Binaries map[string]string
	// Files maps a name to a file on the host (a prebuilt binary such as
	// Nomad) copied next to the Binaries; BinDir holds it inside.
	Files map[string]string
	// Timeout bounds the whole guest run (default 10 min).
	Timeout time.Duration
	// Memory for the guest (default 2G).
	Memory string
	// Docker boots the guest with its release's Docker Engine (dockerd,
	// containerd, runc) on PATH; nothing starts it.
	Docker bool
}

const (
	envInGuest  = "ZFS_NOMAD_IN_GUEST"
	envBinDir   = "ZFS_NOMAD_BIN_DIR"
	envSkip     = "ZFS_NOMAD_SKIP_GUEST"
	envRelease  = "ZFS_NOMAD_GUEST"
	envKeepLogs = "ZFS_NOMAD_GUEST_LOGS"
)

// defaultRelease is the guest guest/image.sh boots without
// ZFS_NOMAD_GUEST. Binaries for a guest are built for its release by
// name, so a host of another release (or none) never builds them for its
// own libzfs.
const defaultRelease = "bookworm"

// InGuest reports whether the tests run with real ZFS (in the guest or on a
// ZFS host).
func InGuest() bool { return haveZFS() }

func haveZFS() bool {
	_, err := os.Stat("/dev/zfs")
	return err == nil
}

// Main runs the tests of m where ZFS is and returns the exit code.
func Main(m *testing.M, opts Options) int {
	if haveZFS() {
		if os.Getenv(envInGuest) == "" && os.Getenv(guestcluster.EnvDisks) == "" {
			// A host with ZFS: pools go on image files, never on devices.
			cleanup, err := imageDisks(opts.allDisks())
			if err != nil {
				fmt.Fprintln(os.Stderr, "guesttest:", err)
				return 1
			}
			defer cleanup()
		}
		if os.Getenv(envBinDir) == "" {
			dir, err := os.MkdirTemp("", "zfs-nomad-bin")
			if err != nil {
				fmt.Fprintln(os.Stderr, "guesttest:", err)
				return 1
			}
			defer os.RemoveAll(dir)
			if err := buildBinaries(opts, "", dir); err != nil {
				fmt.Fprintln(os.Stderr, "guesttest:", err)
				return 1
			}
			os.Setenv(envBinDir, dir)
		}
		openSlots(opts)
		report := accountCPU()
		code := m.Run()
		report()
		return code
	}
	if os.Getenv(envInGuest) != "" {
		fmt.Fprintln(os.Stderr, "guesttest: inside the guest but /dev/zfs is missing: the zfs module did not load (see the console log)")
		return 1
	}
	if os.Getenv(envSkip) != "" {
		fmt.Println("guesttest: no /dev/zfs and ZFS_NOMAD_SKIP_GUEST is set: skipping the tests that need real ZFS")
		return 0
	}
	code, err := runInGuest(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "guesttest:", err)
		return 1
	}
	return code
}

// BinDir returns the directory of the binaries built for Options.Binaries.
func BinDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(envBinDir)
	if dir == "" {
		t.Fatalf("no binaries: call guesttest.Main from TestMain")
	}
	return dir
}

func runInGuest(opts Options) (int, error) {
	return guestRun{opts: opts, release: cmp.Or(os.Getenv(envRelease), defaultRelease), args: os.Args[1:]}.run()
}

// A guestRun is one boot of a guest that reruns this test binary inside.
type guestRun struct {
	opts    Options
	release string   // the guest's Debian release
	args    []string // the test binary's flags inside
	// exchange, when set, is a host directory whose files the tests find
	// in /share/exchange and whose contents they leave there come back.
	exchange string
}

func (g guestRun) run() (int, error) {
	repo, err := repoRoot()
	if err != nil {
		return 0, err
	}
	share, err := os.MkdirTemp(os.Getenv(envKeepLogs), "zfs-guest-run-")
	if err != nil {
		return 0, err
	}
	if err := os.Mkdir(filepath.Join(share, "bin"), 0o755); err != nil {
		return 0, err
	}
	if err := buildBinaries(g.opts, g.release, filepath.Join(share, "bin")); err != nil {
		return 0, err
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return 0, err
	}
	if err := placeTestBinary(self, g.release, repo, cwd, filepath.Join(share, "pkg.test")); err != nil {
		return 0, err
	}
	if g.exchange != "" {
		if err := os.CopyFS(filepath.Join(share, "exchange"), os.DirFS(g.exchange)); err != nil {
			return 0, fmt.Errorf("copying %s into the guest's share: %w", g.exchange, err)
		}
	}
	exports := fmt.Sprintf("%s=1 %s=/share/bin PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp", envInGuest, envBinDir)
	if os.Getenv(envCPU) != "" {
		exports += " " + envCPU + "=" + guestCPUReport
	}
	script := fmt.Sprintf("#!/bin/sh\nexport %s\ncd %s || exit 1\nexec /share/pkg.test %s\n",
		exports, shellQuote(cwd), guestArgs(g.args))
	if err := os.WriteFile(filepath.Join(share, "run.sh"), []byte(script), 0o755); err != nil {
		return 0, err
	}

	timeout := g.opts.Timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	args := []string{"-t", fmt.Sprint(int(timeout.Seconds())), "-r", repo}
	if g.opts.Memory != "" {
		args = append(args, "-m", g.opts.Memory)
	}
	for _, d := range g.opts.allDisks() {
		args = append(args, "-d", d)
	}
	if g.opts.Docker {
		args = append(args, "-D")
	}
	args = append(args, share)
	cmd := exec.Command(filepath.Join(repo, "guest", "run.sh"), args...)
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), envRelease+"="+g.release)
	err = cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		return 0, fmt.Errorf("running the guest: %w", err)
	}
	if g.exchange != "" && code == 0 {
		if err := copyNewFiles(g.exchange, filepath.Join(share, "exchange")); err != nil {
			return 0, fmt.Errorf("copying the guest's exchange back to %s: %w", g.exchange, err)
		}
	}
	if err := keepCPUSummary(share, cwd, g.release); err != nil {
		fmt.Fprintln(os.Stderr, "guesttest:", err)
	}
	if code == 0 {
		os.RemoveAll(share)
	} else {
		fmt.Fprintf(os.Stderr, "guesttest: guest run failed (exit %d); console log kept at %s\n", code, filepath.Join(share, "console.log"))
	}
	return code, nil
}

// RunPhase boots a guest of release (bookworm or trixie) and runs there
// the tests of this package that match run, with the files of the host
// directory exchange in /share/exchange; what they leave there comes back
// to exchange. It lets one host-side test carry data between guests of
// different releases (test/crossversion). The package's TestMain must run
// the host's tests itself (Main does not: use MainPhases).
func RunPhase(t testing.TB, release, run, exchange string, opts Options) {
	t.Helper()
	args := []string{"-test.run=" + run, "-test.v"}
	code, err := guestRun{opts: opts, release: release, args: args, exchange: exchange}.run()
	if err != nil {
		t.Fatalf("guest phase %s on %s: %v", run, release, err)
	}
	if code != 0 {
		t.Fatalf("guest phase %s on %s failed (exit %d): its output is above", run, release, code)
	}
}

// MainPhases is Main for packages whose host-side tests start guests
// themselves (RunPhase): it runs the tests in place, on the host and in
// each guest alike, and skips them all where no guest can run.
func MainPhases(m *testing.M) int {
	if !haveZFS() && os.Getenv(envSkip) != "" {
		fmt.Println("guesttest: no /dev/zfs and ZFS_NOMAD_SKIP_GUEST is set: skipping the tests that need real ZFS")
		return 0
	}
	return m.Run()
}

// Exchange is the directory a phase's tests share with the host (RunPhase).
const Exchange = "/share/exchange"

// guestArgs keeps the test flags, minus those naming host files.
func guestArgs(args []string) string {
	var out []string
	for _, a := range args {
		name := strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-")
		switch name {
		case "test.testlogfile", "test.coverprofile", "test.outputdir", "test.gocoverdir":
			continue
		}
		out = append(out, shellQuote(a))
	}
	return strings.Join(out, " ")
}

// placeTestBinary puts the test binary for the guest at dst: this one, or,
// when it links libzfs and the guest runs another release than the host,
// the package's test binary rebuilt against that release's libzfs.
func placeTestBinary(self, release, repo, pkgDir, dst string) error {
	if release == hostRelease() || !linksLibzfs(self) {
		return copyFile(self, dst, 0o755)
	}
	rel, err := filepath.Rel(repo, pkgDir)
	if err != nil {
		return err
	}
	return goBuild(repo, release, "-t", "-o", dst, "./"+rel)
}

// linksLibzfs reports whether the ELF binary at path loads libzfs.
func linksLibzfs(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	libs, _ := f.ImportedLibraries()
	for _, lib := range libs {
		if strings.HasPrefix(lib, "libzfs.so") {
			return true
		}
	}
	return false
}

// hostRelease is the host's Debian codename ("" when it has none).
func hostRelease() string {
	data, _ := os.ReadFile("/etc/os-release")
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VERSION_CODENAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// goBuild runs hack/gobuild.sh, which builds for release ("" for the
// host's own).
func goBuild(repo, release string, args ...string) error {
	if release != "" {
		args = append([]string{"-r", release}, args...)
	}
	cmd := exec.Command(filepath.Join(repo, "hack", "gobuild.sh"), args...)
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/gobuild.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// buildBinaries builds opts.Binaries into dir and copies opts.Files there.
func buildBinaries(opts Options, release, dir string) error {
	for name, src := range opts.Files {
		if err := copyFile(src, filepath.Join(dir, name), 0o755); err != nil {
			return fmt.Errorf("copying %s: %w", src, err)
		}
	}
	if len(opts.Binaries) == 0 {
		return nil
	}
	repo, err := repoRoot()
	if err != nil {
		return err
	}
	for name, pkg := range opts.Binaries {
		if err := goBuild(repo, release, "-o", filepath.Join(dir, name), pkg); err != nil {
			return err
		}
	}
	return nil
}

// copyNewFiles copies the files under src that dst does not have yet.
func copyNewFiles(dst, src string) error {
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if _, err := os.Stat(target); err == nil {
			return nil
		}
		return copyFile(path, target, 0o644)
	})
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// imageDisks creates sparse image files of the given sizes and names them
// in ZFS_NOMAD_TEST_DISKS.
func imageDisks(sizes []string) (func(), error) {
	dir, err := os.MkdirTemp("", "zfs-nomad-disks")
	if err != nil {
		return nil, err
	}
	var paths []string
	for i, size := range sizes {
		bytes, err := config.ParseByteSize(size)
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, fmt.Sprintf("disk%d.img", i))
		f, err := os.Create(p)
		if err == nil {
			err = f.Truncate(int64(bytes))
			f.Close()
		}
		if err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	os.Setenv(guestcluster.EnvDisks, strings.Join(paths, ","))
	return func() { os.RemoveAll(dir) }, nil
}
