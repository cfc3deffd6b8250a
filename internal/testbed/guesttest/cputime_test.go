package guesttest

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"
)

func TestCompToTicks(t *testing.T) {
	for _, tc := range []struct {
		comp uint16
		want uint64
	}{
		{0, 0},
		{1, 1},
		{0x1fff, 8191},               // the largest mantissa, exponent 0
		{1<<13 | 5, 40},              // exponent 1: times 8
		{3<<13 | 0x1000, 4096 * 512}, // exponent 3: times 8^3
		{7<<13 | 1, 1 << 21},         // the largest exponent
	} {
		if got := compToTicks(tc.comp); got != tc.want {
			t.Errorf("compToTicks(%#x) = %d, want %d", tc.comp, got, tc.want)
		}
	}
}

// acctRecord builds an acct_v3 record as the kernel writes it.
func acctRecord(version byte, command string, utime, stime uint16, elapsedTicks float32) []byte {
	r := make([]byte, acctRecordSize)
	r[1] = version
	binary.LittleEndian.PutUint32(r[28:], math.Float32bits(elapsedTicks))
	binary.LittleEndian.PutUint16(r[32:], utime)
	binary.LittleEndian.PutUint16(r[34:], stime)
	copy(r[48:], command)
	return r
}

func TestParseAcct(t *testing.T) {
	var data []byte
	data = append(data, acctRecord(3, "zfs-node", 150, 50, 1000)...)
	data = append(data, acctRecord(3, "a-sixteen-chars", 1<<13|1, 0, 10)...)
	got, err := parseAcct(data)
	if err != nil {
		t.Fatal(err)
	}
	want := []processTime{
		{command: "zfs-node", cpu: 2 * time.Second, elapsed: 10 * time.Second},
		{command: "a-sixteen-chars", cpu: 80 * time.Millisecond, elapsed: 100 * time.Millisecond},
	}
	if len(got) != len(want) {
		t.Fatalf("parsed %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("record %d: %+v, want %+v", i, got[i], want[i])
		}
	}

	for _, tc := range []struct {
		name string
		data []byte
		err  string
	}{
		{"a torn record", data[:acctRecordSize+3], "not a whole number"},
		{"version 2", acctRecord(2, "sh", 1, 1, 1), "version 2, want 3"},
	} {
		if _, err := parseAcct(tc.data); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.err)
		}
	}
}

func TestWriteCPUSummary(t *testing.T) {
	procs := []processTime{
		{command: "zfs", cpu: time.Second, elapsed: 2 * time.Second},
		{command: "zfs-node", cpu: 3 * time.Second, elapsed: 60 * time.Second},
		{command: "zfs", cpu: 2 * time.Second, elapsed: 3 * time.Second},
	}
	var out strings.Builder
	if err := writeCPUSummary(&out, procs, 10*time.Second, 2); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{
		"6.0 CPU-s in 3 exited processes over 10.0 s of tests on 2 CPUs: 30% busy",
		"command            runs      CPU-s   lifetime-s",
		"zfs                   2        3.0          5.0",
		"zfs-node              1        3.0         60.0",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("summary:\n%s\nwant:\n%s", out.String(), strings.Join(want, "\n"))
	}
}
