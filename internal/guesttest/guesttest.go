// Package guesttest runs a package's tests where real ZFS is.
//
// A test package that needs ZFS calls Main from its TestMain. On a host with
// /dev/zfs the tests run directly. Otherwise Main builds the binaries the
// tests need, copies the test binary into a share directory, boots the ZFS
// guest (guest/run.sh) with the repository mounted read-only at the same
// path, reruns itself inside with the same flags and relays the output and
// exit status, so `go test` prints ordinary PASS/FAIL lines.
//
//	host: go test ./internal/zfs/libzfs
//	        └─ pkg.test (no /dev/zfs) ── guest/run.sh ── QEMU
//	                                                     └─ pkg.test (ZFS_NOMAD_IN_GUEST=1)
//
// Set ZFS_NOMAD_SKIP_GUEST=1 to skip such packages on a host without ZFS
// (make unit does); make test never sets it.
package guesttest

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zfs-nomad/zfs-nomad/internal/config"
	"github.com/zfs-nomad/zfs-nomad/internal/sim"
)

// DriverBinaries are the driver's two programs, for Options.Binaries.
func DriverBinaries() map[string]string {
	return map[string]string{"zfs-node": "./cmd/zfs-node", "zfs-controller": "./cmd/zfs-controller"}
}

// Options say what a package's guest run needs.
type Options struct {
	// Disks are the sizes of the guest's virtio disks (/dev/vda, ...).
	Disks []string
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
}

const (
	envInGuest  = "ZFS_NOMAD_IN_GUEST"
	envBinDir   = "ZFS_NOMAD_BIN_DIR"
	envSkip     = "ZFS_NOMAD_SKIP_GUEST"
	envKeepLogs = "ZFS_NOMAD_GUEST_LOGS"
)

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
		if os.Getenv(envInGuest) == "" && os.Getenv(sim.EnvDisks) == "" {
			// A host with ZFS: pools go on image files, never on devices.
			cleanup, err := imageDisks(opts.Disks)
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
			if err := buildBinaries(opts, dir); err != nil {
				fmt.Fprintln(os.Stderr, "guesttest:", err)
				return 1
			}
			os.Setenv(envBinDir, dir)
		}
		return m.Run()
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
	if err := buildBinaries(opts, filepath.Join(share, "bin")); err != nil {
		return 0, err
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	if err := copyFile(self, filepath.Join(share, "pkg.test"), 0o755); err != nil {
		return 0, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return 0, err
	}
	script := fmt.Sprintf("#!/bin/sh\nexport %s=1 %s=/share/bin PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp\ncd %s || exit 1\nexec /share/pkg.test %s\n",
		envInGuest, envBinDir, shellQuote(cwd), guestArgs(os.Args[1:]))
	if err := os.WriteFile(filepath.Join(share, "run.sh"), []byte(script), 0o755); err != nil {
		return 0, err
	}

	timeout := opts.Timeout
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	args := []string{"-t", fmt.Sprint(int(timeout.Seconds())), "-r", repo}
	if opts.Memory != "" {
		args = append(args, "-m", opts.Memory)
	}
	for _, d := range opts.Disks {
		args = append(args, "-d", d)
	}
	args = append(args, share)
	cmd := exec.Command(filepath.Join(repo, "guest", "run.sh"), args...)
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	err = cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		return 0, fmt.Errorf("running the guest: %w", err)
	}
	if code == 0 {
		os.RemoveAll(share)
	} else {
		fmt.Fprintf(os.Stderr, "guesttest: guest run failed (exit %d); console log kept at %s\n", code, filepath.Join(share, "console.log"))
	}
	return code, nil
}

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

// buildBinaries builds opts.Binaries into dir and copies opts.Files there.
func buildBinaries(opts Options, dir string) error {
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
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, name), pkg)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %v\n%s", pkg, err, out)
		}
	}
	return nil
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
	os.Setenv(sim.EnvDisks, strings.Join(paths, ","))
	return func() { os.RemoveAll(dir) }, nil
}
