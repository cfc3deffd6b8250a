//go:build linux

package mount

import "testing"

func TestParseMountInfoLine(t *testing.T) {
	tests := []struct {
		line string
		want Entry
	}{
		{
			"36 35 0:32 / /tmp/n1/staging/vol-1 rw,noatime shared:1 - zfs pool1/nomad/vol-1 rw,xattr,noacl",
			Entry{Root: "/", MountPoint: "/tmp/n1/staging/vol-1", Options: "rw,noatime", FSType: "zfs", Source: "pool1/nomad/vol-1"},
		},
		{
			`40 36 0:32 / /data/with\040space ro,nosuid - zfs tank/v rw`,
			Entry{Root: "/", MountPoint: "/data/with space", Options: "ro,nosuid", FSType: "zfs", Source: "tank/v"},
		},
		{
			"22 1 8:1 /sub /mnt rw master:3 shared:4 - ext4 /dev/sda1 rw",
			Entry{Root: "/sub", MountPoint: "/mnt", Options: "rw", FSType: "ext4", Source: "/dev/sda1"},
		},
	}
	for _, tc := range tests {
		got, err := ParseMountInfoLine(tc.line)
		if err != nil || got != tc.want {
			t.Errorf("ParseMountInfoLine(%q) = %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "1 2 3", "1 2 3 4 5 6 7 8 9 10"} {
		if _, err := ParseMountInfoLine(bad); err == nil {
			t.Errorf("ParseMountInfoLine(%q) accepted", bad)
		}
	}
	if e := (Entry{Options: "ro,nosuid"}); !e.HasOption("ro") || e.HasOption("rw") {
		t.Error("HasOption")
	}
}

func TestFlags(t *testing.T) {
	if _, err := Flags([]string{"ro", "noexec"}); err != nil {
		t.Error(err)
	}
	if _, err := Flags([]string{"suid"}); err == nil {
		t.Error("unknown flag accepted")
	}
}
