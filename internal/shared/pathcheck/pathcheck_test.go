package pathcheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	base := t.TempDir()
	if err := os.MkdirAll(filepath.Join(base, "real/dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	bases := []string{base, "/etc/zfs"}
	tests := []struct {
		path string
		want string // in the error; "" for none
	}{
		{base + "/real/dir/target", ""},
		{base + "/new/staging", ""},
		{base + "/real", ""},
		{"relative/target", "not absolute"},
		{base + "/real/../../escape", "not clean"},
		{base + "/real//dir", "not clean"},
		{base + "/real/", "not clean"},
		{base, "not below"},
		{"/var/lib/other/target", "not below"},
		{"/etc", "system directory"},
		{"/etc/zfs/target", "system directory"},
		{base + "/link", "symbolic link"},
		{base + "/link/target", "symbolic link"},
	}
	for _, tt := range tests {
		err := Check(tt.path, bases)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("Check(%q) = %v, want nil", tt.path, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("Check(%q) = %v, want an error saying %q", tt.path, err, tt.want)
		}
	}
}

func TestValidateBase(t *testing.T) {
	for base, ok := range map[string]bool{
		"/var/lib/nomad/client/csi": true, "/csi": true,
		"/": false, "/etc": false, "/usr/local/csi": false, "relative": false, "/a/../b": false, "/a/": false,
	} {
		if err := ValidateBase(base); (err == nil) != ok {
			t.Errorf("ValidateBase(%q) = %v, want ok=%v", base, err, ok)
		}
	}
}

func TestNomadBase(t *testing.T) {
	tests := map[string]string{
		"unix:///opt/nomad/data/client/csi/plugins/4b1c/csi.sock": "/opt/nomad/data/client/csi",
		"unix:///nomad/data/client/csi/plugins/x/csi.sock":        "/nomad/data/client/csi",
		"unix:///run/zfs-nomad/csi.sock":                          "",
		"tcp://127.0.0.1:9000":                                    "",
	}
	for endpoint, want := range tests {
		if got := NomadBase(endpoint); got != want {
			t.Errorf("NomadBase(%q) = %q, want %q", endpoint, got, want)
		}
	}
}
