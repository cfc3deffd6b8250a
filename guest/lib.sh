# Sourced by the guest's build stages (build-image.sh, build-docker.sh).

log() { printf 'guest-build: %s\n' "$*" >&2; }

# in_root ROOT COMMAND... runs COMMAND chrooted in ROOT with a clean
# environment.
in_root() { local r=$1; shift; chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }

# copy_with_libs FROM TO FILE... copies binaries and the shared libraries
# they load from the chroot FROM to the tree TO.
copy_with_libs() {
  local from=$1 to=$2 f lib
  shift 2
  for f in "$@"; do
    [ -e "$from$f" ] || { log "missing $f"; exit 1; }
    mkdir -p "$to$(dirname "$f")"
    cp -aL "$from$f" "$to$f"
    for lib in $(in_root "$from" ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true); do
      [ -e "$to$lib" ] && continue
      mkdir -p "$to$(dirname "$lib")"
      cp -aL "$from$lib" "$to$lib"
    done
  done
}
