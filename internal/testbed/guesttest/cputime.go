package guesttest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"
)

// With ZFS_NOMAD_GUEST_CPU=DIR set on the host, a package's guest run
// turns on the kernel's process accounting (acct(2)) before its tests and,
// once they end, writes the CPU time of every process that exited in
// between, summed by command name, to DIR/PACKAGE-RELEASE.txt on the
// host. It says where a guest package's time goes: how busy the guest's
// emulated CPUs were, and on what (docs/testing.md, "Where a guest
// package's time goes").
const envCPU = "ZFS_NOMAD_GUEST_CPU"

// guestCPUReport is where the guest writes the summary, in its share.
const guestCPUReport = "/share/cpu.txt"

// acctRecordSize is the size of a struct acct_v3 (linux/acct.h).
const acctRecordSize = 64

// acctHZ is the unit of the records' times (AHZ: USER_HZ, 100 on x86).
const acctHZ = 100

// A processTime is one exited process's accounting record.
type processTime struct {
	command string
	cpu     time.Duration // user and system
	elapsed time.Duration
}

// compToTicks decodes a comp_t: a 13-bit mantissa and a 3-bit base-8
// exponent.
func compToTicks(c uint16) uint64 {
	return uint64(c&0x1fff) << (3 * ((c >> 13) & 7))
}

// parseAcct reads acct_v3 records (little-endian, as x86 writes them).
func parseAcct(data []byte) ([]processTime, error) {
	if len(data)%acctRecordSize != 0 {
		return nil, fmt.Errorf("%d bytes of process accounting is not a whole number of %d-byte records", len(data), acctRecordSize)
	}
	var out []processTime
	for off := 0; off < len(data); off += acctRecordSize {
		r := data[off : off+acctRecordSize]
		if version := r[1] & 0x7f; version != 3 {
			return nil, fmt.Errorf("process accounting record %d is version %d, want 3 (acct_v3)", off/acctRecordSize, version)
		}
		etime := math.Float32frombits(binary.LittleEndian.Uint32(r[28:32]))
		ticks := compToTicks(binary.LittleEndian.Uint16(r[32:34])) + compToTicks(binary.LittleEndian.Uint16(r[34:36]))
		out = append(out, processTime{
			command: strings.TrimRight(string(r[48:64]), "\x00"),
			cpu:     time.Duration(ticks) * time.Second / acctHZ,
			elapsed: time.Duration(float64(etime) * float64(time.Second) / acctHZ),
		})
	}
	return out, nil
}

// writeCPUSummary writes the processes' CPU time by command, the
// largest first, after a line with the total against the wall time of
// cpus CPUs.
func writeCPUSummary(w io.Writer, procs []processTime, wall time.Duration, cpus int) error {
	type sum struct {
		command      string
		n            int
		cpu, elapsed time.Duration
	}
	by := map[string]*sum{}
	var total time.Duration
	for _, p := range procs {
		s := by[p.command]
		if s == nil {
			s = &sum{command: p.command}
			by[p.command] = s
		}
		s.n++
		s.cpu += p.cpu
		s.elapsed += p.elapsed
		total += p.cpu
	}
	sums := make([]*sum, 0, len(by))
	for _, s := range by {
		sums = append(sums, s)
	}
	sort.Slice(sums, func(i, j int) bool {
		if sums[i].cpu != sums[j].cpu {
			return sums[i].cpu > sums[j].cpu
		}
		return sums[i].command < sums[j].command
	})
	busy := 0.0
	if wall > 0 && cpus > 0 {
		busy = total.Seconds() / (wall.Seconds() * float64(cpus))
	}
	fmt.Fprintf(w, "%.1f CPU-s in %d exited processes over %.1f s of tests on %d CPUs: %.0f%% busy\n",
		total.Seconds(), len(procs), wall.Seconds(), cpus, 100*busy)
	fmt.Fprintf(w, "%-16s %6s %10s %12s\n", "command", "runs", "CPU-s", "lifetime-s")
	for _, s := range sums {
		if _, err := fmt.Fprintf(w, "%-16s %6d %10.1f %12.1f\n", s.command, s.n, s.cpu.Seconds(), s.elapsed.Seconds()); err != nil {
			return err
		}
	}
	return nil
}

// accountCPU turns process accounting on in the guest when the host asked
// for it (envCPU) and returns the function that turns it off and writes
// the summary; a no-op otherwise. Accounting that cannot be turned on is
// reported and the tests run all the same: it is a measurement, not a
// test.
func accountCPU() (report func()) {
	if os.Getenv(envCPU) == "" || os.Getenv(envInGuest) == "" {
		return func() {}
	}
	file := filepath.Join(os.TempDir(), "guesttest.acct")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "guesttest: no CPU summary:", err)
		return func() {}
	}
	if err := syscall.Acct(file); err != nil {
		fmt.Fprintln(os.Stderr, "guesttest: no CPU summary: turning process accounting on:", err)
		return func() {}
	}
	began := time.Now()
	return func() {
		wall := time.Since(began)
		err := accountingOff()
		var procs []processTime
		if err == nil {
			var data []byte
			if data, err = os.ReadFile(file); err == nil {
				procs, err = parseAcct(data)
			}
		}
		if err == nil {
			var out *os.File
			if out, err = os.Create(os.Getenv(envCPU)); err == nil {
				err = errors.Join(writeCPUSummary(out, procs, wall, runtime.NumCPU()), out.Close())
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "guesttest: no CPU summary:", err)
		}
	}
}

// accountingOff turns process accounting off: acct(2) with a null path
// (syscall.Acct("") passes an empty one, which is ENOENT).
func accountingOff() error {
	if _, _, errno := syscall.Syscall(syscall.SYS_ACCT, 0, 0, 0); errno != 0 {
		return fmt.Errorf("turning process accounting off: %w", errno)
	}
	return nil
}

// keepCPUSummary copies the guest's summary from its share to the host
// directory the host named, as PACKAGE-RELEASE.txt.
func keepCPUSummary(share, pkgDir, release string) error {
	dir := os.Getenv(envCPU)
	if dir == "" {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(share, filepath.Base(guestCPUReport)))
	if err != nil {
		return fmt.Errorf("the guest wrote no CPU summary: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	name := strings.ReplaceAll(filepath.Base(pkgDir), string(filepath.Separator), "-") + "-" + release + ".txt"
	return os.WriteFile(filepath.Join(dir, name), data, 0o644)
}
