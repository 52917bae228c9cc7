#!/usr/bin/env bash
# Builds the swapgate image from the repository's Dockerfile, also on a host that cannot pull
# the Dockerfile's base image (no registry, no mirror).
#
#   deploy/image/build.sh [TAG [BUILD-ARGS...]]    # TAG: $SWAPGATE_IMAGE, else "swapgate"
#   deploy/image/build.sh swapgate:0.1.0 --network host
#
# It runs `docker build` when a Docker daemon answers, else `podman build --format docker` (the
# OCI format would drop the HEALTHCHECK); SWAPGATE_BUILDER=docker|podman picks one. BUILD-ARGS go
# to that command as they are.
#
# When the base image (python:3.11-slim) is neither present nor pullable, it makes a stand-in
# with the same role from Debian packages and imports it under the base's name: a minbase
# Debian whose python3 has the base's version (bookworm: 3.11), with python3-venv,
# python-is-python3, ca-certificates and this host's CA bundle (for a TLS-inspecting proxy in
# front of PyPI). That needs root and debootstrap; the root file system is kept as a tarball in
# $SWAPGATE_IMAGE_CACHE (default ~/.cache/swapgate/image-base), so the next time takes seconds.
# SWAPGATE_DEBIAN_MIRROR: the Debian mirror (default: this host's apt mirror, else deb.debian.org).
# SWAPGATE_PULL_BASE=0: do not try to pull the base first.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tag=${1:-${SWAPGATE_IMAGE:-swapgate}}
[ $# -gt 0 ] && shift
build_args=("$@")

say() { echo "build.sh: $*" >&2; }
die() { say "$*"; exit 1; }

# The builder: docker where its daemon answers, else podman.
builder=${SWAPGATE_BUILDER:-}
if [ -z "$builder" ]; then
  if command -v docker >/dev/null 2>&1 && timeout 20 docker info >/dev/null 2>&1; then
    builder=docker
  elif command -v podman >/dev/null 2>&1; then
    builder=podman
  else
    die "neither a Docker daemon nor podman answers: install one (Debian: apt-get install podman)"
  fi
fi
case "$builder" in
  docker | podman) ;;
  *) die "SWAPGATE_BUILDER must be docker or podman, not '$builder'" ;;
esac

# The base images the Dockerfile starts from (a FROM naming an earlier stage is not one).
mapfile -t stages < <(sed -nE 's/^FROM[[:space:]]+[^[:space:]]+[[:space:]]+AS[[:space:]]+([^[:space:]]+).*/\1/Ip' "$root/Dockerfile")
mapfile -t bases < <(sed -nE 's/^FROM[[:space:]]+([^[:space:]]+).*/\1/Ip' "$root/Dockerfile" | sort -u)

# The Debian suite whose python3 is the version a python:X.Y-slim base carries.
debian_suite() {
  case "$1" in
    python:3.11-slim* | docker.io/library/python:3.11-slim*) echo bookworm ;;
    python:3.13-slim* | docker.io/library/python:3.13-slim*) echo trixie ;;
    *) return 1 ;;
  esac
}

debian_mirror() {
  if [ -n "${SWAPGATE_DEBIAN_MIRROR:-}" ]; then echo "$SWAPGATE_DEBIAN_MIRROR"; return; fi
  local found=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    found=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$found" ] && [ -r /etc/apt/sources.list ]; then
    found=$(awk '/^deb[[:space:]]/ && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list)
  fi
  echo "${found:-http://deb.debian.org/debian}"
}

# Unmounts whatever debootstrap left mounted under $1 (proc, sys, a bound /dev), then removes it
# without crossing into another file system.
remove_tree() {
  local dir=$1 mounts
  [ -d "$dir" ] || return 0
  mounts=$(awk -v d="$dir/" 'index($2 "/", d) == 1 {print $2}' /proc/mounts | sort -r)
  for m in $mounts; do umount -l "$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$dir"
}

# The stand-in's root file system as a tarball, made once per suite, package set and CA bundle.
standin_tarball() {
  local base=$1 suite=$2 cache packages ca key tarball work
  cache=${SWAPGATE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/swapgate/image-base}
  packages=python3,python3-venv,python-is-python3,ca-certificates
  ca=/etc/ssl/certs/ca-certificates.crt
  [ -r "$ca" ] || die "no CA bundle at $ca"
  key=$( { echo "$suite $packages"; cat "$ca"; } | sha256sum | cut -c1-12)
  tarball=$cache/$suite-python3-$key.tar
  mkdir -p "$cache"
  exec 9>"$cache.lock"
  flock 9
  if [ -s "$tarball" ]; then
    say "stand-in for $base: cached $tarball"
    echo "$tarball"
    return
  fi
  [ "$(id -u)" = 0 ] || die "$base cannot be pulled, and making a stand-in from Debian packages needs root"
  command -v debootstrap >/dev/null 2>&1 || die "$base cannot be pulled, and making a stand-in needs debootstrap (apt-get install debootstrap)"
  work=$(mktemp -d "$cache/rootfs.XXXXXX")
  # shellcheck disable=SC2064  # expand now: the trap must clean this very folder
  trap "remove_tree '$work'" EXIT
  say "stand-in for $base: debootstrap $suite ($packages) from $(debian_mirror), a few minutes"
  if ! nice -n 19 debootstrap --variant=minbase --include="$packages" "$suite" "$work" \
    "$(debian_mirror)" >"$work.log" 2>&1; then
    tail -n 30 "$work.log" >&2
    die "debootstrap failed; its output: $work.log"
  fi
  rm -f "$work.log"
  cp "$ca" "$work/etc/ssl/certs/ca-certificates.crt"
  rm -rf "$work"/var/lib/apt/lists/* "$work"/var/cache/apt/*.bin "$work"/var/cache/apt/archives/*.deb
  want=${base#*python:}; want=${want%%-*}
  have=$(chroot "$work" python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [ "$have" = "$want" ] || die "$suite's python is $have, $base carries $want"
  tar --numeric-owner -C "$work" --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
    -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  remove_tree "$work"
  trap - EXIT
  find "$cache" -maxdepth 1 -name "$suite-python3-*.tar" ! -path "$tarball" -delete
  say "stand-in for $base: cached $tarball ($(du -h "$tarball" | cut -f1))"
  echo "$tarball"
}

is_stage() {
  local stage
  for stage in "${stages[@]}"; do [ "${stage,,}" = "${1,,}" ] && return 0; done
  return 1
}

for base in "${bases[@]}"; do
  is_stage "$base" && continue
  if "$builder" image inspect "$base" >/dev/null 2>&1; then
    say "base $base: present"
    continue
  fi
  if [ "${SWAPGATE_PULL_BASE:-1}" != 0 ]; then
    if pulled=$(timeout 120 "$builder" pull -q "docker.io/library/${base#docker.io/library/}" 2>&1); then
      say "base $base: pulled"
      continue
    fi
    say "base $base: cannot be pulled: $(tail -n 1 <<<"$pulled")"
  fi
  suite=$(debian_suite "$base") || die "$base cannot be pulled, and there is no Debian stand-in for it"
  tarball=$(standin_tarball "$base" "$suite")
  "$builder" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --change "LABEL org.opencontainers.image.description=\"stand-in for $base: Debian $suite python3, made by deploy/image/build.sh\"" \
    "$tarball" "$base" >/dev/null
  say "base $base: imported the Debian $suite stand-in"
done

format=()
[ "$builder" = podman ] && format=(--format docker)  # keeps HEALTHCHECK, which OCI has no field for
say "$builder build -t $tag ${format[*]} ${build_args[*]}"
nice -n "${SWAPGATE_BUILD_NICE:-0}" "$builder" build "${format[@]}" "${build_args[@]}" -t "$tag" -f "$root/Dockerfile" "$root"
say "built $tag with $builder"
