package openzfs

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		want      Versions
		wantErr   bool
	}{
		{name: "Debian 12", out: "zfs-2.1.11-1+deb12u1\nzfs-kmod-2.1.11-1+deb12u1\n", want: Versions{"2.1.11-1+deb12u1", "2.1.11-1+deb12u1"}},
		{name: "Ubuntu 24.04", out: "zfs-2.2.2-0ubuntu9.1\nzfs-kmod-2.2.2-0ubuntu9\n", want: Versions{"2.2.2-0ubuntu9.1", "2.2.2-0ubuntu9"}},
		{name: "Proxmox", out: "zfs-2.2.4-pve1\nzfs-kmod-2.2.4-pve1\n", want: Versions{"2.2.4-pve1", "2.2.4-pve1"}},
		{name: "no kernel module", out: "zfs-2.1.11-1\nzfs_version_kernel() failed: No such file or directory\n", wantErr: true},
		{name: "nothing", out: "", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.out)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Parse: %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && got != tc.want {
				t.Errorf("Parse = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name     string
		v        Versions
		builtFor string
		wantErr  string // a part of the error, "" for none
	}{
		{name: "one release, built for it", v: Versions{"2.1.11-1", "2.1.11-1"}, builtFor: "2.1.11"},
		{name: "a later point release of the series", v: Versions{"2.1.15-1", "2.1.15-1"}, builtFor: "2.1.11"},
		{name: "built without the Makefile", v: Versions{"2.3.9-1", "2.3.9-1"}},
		{name: "upgraded, not rebooted", v: Versions{"2.3.9-1", "2.1.11-1"}, builtFor: "2.1.11", wantErr: "kernel module is 2.1.11-1: in a container, use the zfs-node image built for OpenZFS 2.1"},
		{name: "another series than the build's", v: Versions{"2.3.9-1", "2.3.9-1"}, builtFor: "2.1.11", wantErr: "built against libzfs 2.1.11, but this host runs OpenZFS 2.3.9-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.v.Check(tc.builtFor)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Check: %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Check: %v, want an error saying %q", err, tc.wantErr)
			}
		})
	}
}

// TestEncryptedMountDefect: the kernel modules of the 2.1 series (and
// older) are told apart from 2.2 and later, by the kernel module's
// release, not the userland's.
func TestEncryptedMountDefect(t *testing.T) {
	for _, tc := range []struct {
		v    Versions
		want bool
	}{
		{Versions{"2.1.11-1+deb12u1", "2.1.11-1+deb12u1"}, true},
		{Versions{"2.0.7-1", "2.0.7-1"}, true},
		{Versions{"2.2.2-0ubuntu9.1", "2.1.5-1ubuntu6"}, true},
		{Versions{"2.2.4-pve1", "2.2.4-pve1"}, false},
		{Versions{"2.3.9-1", "2.3.9-1"}, false},
		{Versions{"2.1.11-1", "unknown"}, false},
	} {
		if got := tc.v.EncryptedMountDefect(); got != tc.want {
			t.Errorf("%+v: EncryptedMountDefect() = %v, want %v", tc.v, got, tc.want)
		}
	}
}
