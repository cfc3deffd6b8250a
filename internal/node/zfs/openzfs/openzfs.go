// Package openzfs tells which OpenZFS a node runs, its userland (libzfs
// and the zfs command) and its kernel module, and whether both fit the
// libzfs this build was compiled against: a node that talks to
// another release than it was built for, or whose userland and kernel
// module differ (packages upgraded, the host not rebooted), refuses to
// start and says which is which, instead of failing later at some ioctl.
package openzfs

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
)

// BuiltFor is the OpenZFS release whose libzfs headers this build was
// compiled against ("2.1.11"), set by hack/gobuild.sh (make build, the
// guest tests, the images) from pkg-config:
// -ldflags "-X github.com/zfs-nomad/zfs-nomad/internal/node/zfs/openzfs.BuiltFor=...".
// Empty when built without it (a plain go build): then only the userland
// and the kernel module are compared.
var BuiltFor = ""

// Versions are the OpenZFS releases a host runs, as `zfs version` names
// them ("2.1.11-1", "2.2.2-0ubuntu9.1").
type Versions struct {
	Userland string
	Kernel   string
}

var versionLine = regexp.MustCompile(`^zfs-(kmod-)?(\d+\.\d+\.\d+\S*)$`)

// Parse reads the output of `zfs version`: a line for the userland
// ("zfs-2.1.11-1") and one for the kernel module ("zfs-kmod-2.1.11-1").
func Parse(out string) (Versions, error) {
	var v Versions
	for _, line := range strings.Split(out, "\n") {
		m := versionLine.FindStringSubmatch(strings.TrimSpace(line))
		switch {
		case m == nil:
		case m[1] == "":
			v.Userland = m[2]
		default:
			v.Kernel = m[2]
		}
	}
	if v.Userland == "" || v.Kernel == "" {
		return v, fmt.Errorf("zfs version printed %q: want a zfs-<release> and a zfs-kmod-<release> line (is the zfs kernel module loaded?)", strings.TrimSpace(out))
	}
	return v, nil
}

// series is a release's major.minor ("2.1" of "2.1.11-1"): releases of
// one series keep libzfs's ABI and the kernel's ioctls.
func series(release string) string {
	parts := strings.SplitN(release, ".", 3)
	if len(parts) < 2 {
		return release
	}
	return parts[0] + "." + parts[1]
}

// Check reports whether v fits a build compiled against builtFor ("" for
// unknown): the userland and the kernel module of one series, and that
// series the build's.
func (v Versions) Check(builtFor string) error {
	if series(v.Userland) != series(v.Kernel) {
		// In a container the userland is the image's, so the same
		// mismatch means the wrong image rather than a pending reboot.
		return fmt.Errorf("the OpenZFS userland here is %s but its kernel module is %s: in a container, use the zfs-node image built for OpenZFS %s (docs/install.md); on the host, reboot (or reload the zfs module) so that both are one release before starting zfs-node",
			v.Userland, v.Kernel, series(v.Kernel))
	}
	if builtFor != "" && series(builtFor) != series(v.Userland) {
		return fmt.Errorf("this zfs-node was built against libzfs %s, but this host runs OpenZFS %s (kernel module %s): use the zfs-node built for OpenZFS %s",
			builtFor, v.Userland, v.Kernel, series(v.Userland))
	}
	return nil
}

// EncryptedMountDefect reports whether the kernel module is of a series
// whose reads of a block of encrypted dnodes race with its write: a
// mount of an encrypted filesystem (a volume's stage) may then
// dereference NULL in the kernel and leave the node's ZFS hung. Our test
// guest's 2.1.11 did so once, mounting a volume after a move
// (zio_crypt_copy_dnode_bonus under zfsvfs_init); upstream fixed it in
// openzfs/zfs#16104, which no 2.1 release is known to carry.
func (v Versions) EncryptedMountDefect() bool {
	var major, minor int
	if _, err := fmt.Sscanf(v.Kernel, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major < 2 || major == 2 && minor < 2
}

// Detect asks the host's zfs command which releases it and the kernel
// module are.
func Detect(ctx context.Context) (Versions, error) {
	out, err := exec.CommandContext(ctx, "zfs", "version").CombinedOutput()
	if err != nil {
		return Versions{}, fmt.Errorf("cannot tell which OpenZFS runs here: zfs version: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return Parse(string(out))
}
