#!/usr/bin/env bash
# `make demo-nomad`: the Nomad end-to-end scenario (test/nomad) told as a
# demo. A Nomad server and three Nomad clients run in the ZFS guest, each
# client a simulated node with its own pool; the plugins run from the job
# files in nomad/, from the images under the docker driver. Builds Nomad
# once (hack/nomad.sh caches it) and the images (hack/images.sh).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
nomad=$("$repo/hack/nomad.sh")
make -C "$repo" --no-print-directory images >/dev/null
work=$(mktemp -d "${TMPDIR:-/var/tmp}/zfs-demo-nomad.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$repo/test/nomad"
go test -c -o "$work/nomad.test" .
echo "Booting the ZFS guest (real OpenZFS under QEMU), then a Nomad server and three clients; about 6 minutes..."
ZFS_NOMAD_NOMAD=$nomad ZFS_NOMAD_IMAGES=$repo/bin/images "$work/nomad.test" -test.run '^TestNomadEndToEnd$' -test.timeout 25m -narrate 2>&1 |
  grep -v -E '^\[ *[0-9]+\.[0-9]+\] ' # the guest kernel's messages
