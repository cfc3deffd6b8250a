// Package pathcheck checks the host paths a CO hands the CSI node service
// (staging and target paths) before anything is mounted on them. A path
// must be absolute and clean, lie strictly below one of the base
// directories the operator configured, and reach its place without a
// symbolic link below that base: otherwise a claim could bind-mount a
// volume over /etc, into the plugin's working directory, or through a link
// whose unmount later misses the mount.
package pathcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// systemDirs may never be, or contain, a base directory or a checked path.
var systemDirs = []string{"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/root", "/sbin", "/sys", "/usr"}

// DefaultBases are the base directories used when the operator configures
// none: where Nomad places CSI staging and publish paths with its usual
// data directories (raw_exec and exec plugins), and the container paths of
// a plugin run by the docker driver. See docs/config.md.
var DefaultBases = []string{"/var/lib/nomad/client/csi", "/opt/nomad/data/client/csi", "/opt/nomad/client/csi", "/csi", "/local/csi"}

// NomadBase returns the directory under which Nomad places a plugin's
// staging and publish paths, derived from the plugin's CSI endpoint
// (unix://DATA_DIR/client/csi/plugins/ALLOC/csi.sock), or "" when the
// endpoint does not have that shape.
func NomadBase(endpoint string) string {
	path, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok {
		return ""
	}
	dir, _, found := strings.Cut(path, "/client/csi/plugins/")
	if !found || !filepath.IsAbs(dir) {
		return ""
	}
	return filepath.Clean(dir) + "/client/csi"
}

// ValidateBase checks a base directory the operator configured.
func ValidateBase(base string) error {
	if !filepath.IsAbs(base) || filepath.Clean(base) != base {
		return fmt.Errorf("%q: must be an absolute, clean path", base)
	}
	if base == "/" || isSystem(base) {
		return fmt.Errorf("%q: a system directory cannot hold volume mounts", base)
	}
	return nil
}

// Check returns an error saying what is wrong with path, or nil if it is
// absolute, clean, strictly below one of bases, outside the system
// directories, and reached without a symbolic link below its base
// (components that do not exist yet are created later, as directories).
func Check(path string, bases []string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("path %q is not absolute", path)
	}
	if filepath.Clean(path) != path {
		return fmt.Errorf("path %q is not clean (want %q: no .., no //, no trailing /)", path, filepath.Clean(path))
	}
	if isSystem(path) {
		return fmt.Errorf("path %q lies in a system directory", path)
	}
	base := ""
	for _, b := range bases {
		if strings.HasPrefix(path, b+"/") && len(b) > len(base) {
			base = b
		}
	}
	if base == "" {
		return fmt.Errorf("path %q is not below a directory this node mounts volumes in (%s; the operator's mount_base_dirs)", path, strings.Join(bases, ", "))
	}
	return noLinkBelow(base, path)
}

// noLinkBelow checks each existing component of path below base.
func noLinkBelow(base, path string) error {
	at := base
	for _, part := range strings.Split(strings.TrimPrefix(path, base+"/"), "/") {
		at = filepath.Join(at, part)
		info, err := os.Lstat(at)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("checking %q: %w", at, err)
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("path %q passes through the symbolic link %q", path, at)
		}
	}
	return nil
}

func isSystem(path string) bool {
	for _, d := range systemDirs {
		if path == d || strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}
