// Package version holds the build's version, set by the Makefile:
// -ldflags "-X github.com/zfs-nomad/zfs-nomad/internal/shared/version.Version=...".
package version

// Version is the version of this build ("dev" when built without make).
var Version = "dev"

// PluginName is the CSI plugin name both binaries report.
const PluginName = "zfs.csi.zfs-nomad.io"
