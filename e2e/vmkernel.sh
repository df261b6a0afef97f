#!/bin/sh
# Fetches the kernels the real-kernel e2e tier boots under QEMU: the package
# Debian's linux-image-cloud-amd64 depends on, for Debian 12 (bookworm, 6.1)
# into OUT/6.1/root and for Debian 13 (trixie, 6.12) into OUT/6.12/root,
# unpacked with depmod run. Modules packed as .ko.xz (6.12) are unpacked to
# plain .ko first (busybox's insmod hands the kernel the file as it is).
# Idempotent: a second run with the same packages does nothing.
#
# 6.1 comes through the host's own apt (as on a bookworm host, after
# `apt-get update`); 6.12 through a private apt state under OUT/apt-trixie
# (its own sources file, lists and cache), so the host's sources stay as
# they are. The trixie mirror is the host's Debian mirror (NSMD_VM_MIRROR
# overrides it). Needs apt-get, dpkg-deb, depmod (kmod) and xz.
set -eu
out=${1:?usage: vmkernel.sh OUTDIR}
mkdir -p "$out"

# unpack PKG DIR [APT-OPTIONS...]: downloads PKG and unpacks it in DIR/root.
unpack() {
  pkg=$1 dir=$2
  shift 2
  ver=${pkg#linux-image-}
  if [ -f "$dir/root/lib/modules/$ver/modules.dep" ]; then
    echo "vmkernel: $pkg already in $dir"
    return 0
  fi
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get "$@" download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  deb=$(ls "$tmp"/*.deb 2>/dev/null | head -1)
  if [ -z "$deb" ]; then
    rm -rf "$tmp"
    echo "vmkernel: could not download $pkg" >&2
    return 1
  fi
  rm -rf "$dir/root"
  dpkg-deb -x "$deb" "$dir/root"
  rm -rf "$tmp"
  # Merged /usr (trixie): the modules live in usr/lib/modules; depmod and
  # the image builder look in lib/modules.
  if [ ! -e "$dir/root/lib/modules" ] && [ -d "$dir/root/usr/lib/modules" ]; then
    ln -s usr/lib "$dir/root/lib"
  fi
  find "$dir/root/lib/modules/$ver/" -name '*.ko.xz' -exec xz -d -f {} +
  depmod -b "$dir/root" "$ver"
  echo "vmkernel: $pkg unpacked in $dir/root"
}

# Debian 12's 6.1, through the host's apt.
pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$pkg" ] || { echo "vmkernel: linux-image-cloud-amd64 not known to apt (apt-get update?)" >&2; exit 1; }
case "$pkg" in
linux-image-6.1.*) ;;
*) echo "vmkernel: the host's apt offers $pkg, not Debian 12's 6.1" >&2; exit 1 ;;
esac
unpack "$pkg" "$out/6.1"

# Debian 13's 6.12, through a private apt state.
mirror=${NSMD_VM_MIRROR:-$(apt-cache policy 2>/dev/null | awk '$2 ~ /^https?:\/\// && $3 ~ /^[a-z]+\/main$/ && $2 !~ /security/ {print $2; exit}')}
mirror=${mirror:-http://deb.debian.org/debian}
apt=$out/apt-trixie
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s trixie main\n' "$mirror" > "$apt/sources.list"
set -- -o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent \
  -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o Debug::NoLocking=1
depends() { apt-cache "$@" depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
pkg=$(depends "$@")
if [ -z "$pkg" ]; then
  apt-get "$@" update -qq
  pkg=$(depends "$@")
fi
[ -n "$pkg" ] || { echo "vmkernel: linux-image-cloud-amd64 not in trixie at $mirror" >&2; exit 1; }
if ! unpack "$pkg" "$out/6.12" "$@"; then
  # The lists may name a package the mirror no longer has: refresh, retry.
  apt-get "$@" update -qq
  pkg=$(depends "$@")
  unpack "$pkg" "$out/6.12" "$@"
fi
