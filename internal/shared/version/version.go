// Package version holds the build's version.
package version

// Version is the version of this build: the release this source is, or
// will be, with "-dev" until its release commit drops it (CHANGELOG.md
// names the releases), so that a binary or image built from the source
// alone, by go build or a plain docker build, says which release it
// comes from. The Makefile, hack/images.sh and hack/release.sh set the
// exact one (git describe, or the release's tag):
// -ldflags "-X github.com/zfs-nomad/zfs-nomad/internal/shared/version.Version=...".
var Version = "v0.2.0-dev"

// PluginName is the CSI plugin name both binaries report.
const PluginName = "zfs.csi.zfs-nomad.io"
