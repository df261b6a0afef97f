#!/bin/sh
# Fetches the kernel the real-kernel e2e tier boots under QEMU: the package
# Debian's linux-image-cloud-amd64 depends on, unpacked into OUT/root with
# depmod run. Idempotent: a second run with the same package does nothing.
# Needs apt-get (after `apt-get update`), dpkg-deb and depmod (kmod).
set -eu
out=${1:?usage: vmkernel.sh OUTDIR}
pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
[ -n "$pkg" ] || { echo "vmkernel: linux-image-cloud-amd64 not known to apt (apt-get update?)" >&2; exit 1; }
ver=${pkg#linux-image-}
if [ -f "$out/root/lib/modules/$ver/modules.dep" ]; then
  echo "vmkernel: $pkg already in $out"
  exit 0
fi
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
deb=$(ls "$tmp"/*.deb)
rm -rf "$out/root"
dpkg-deb -x "$deb" "$out/root"
depmod -b "$out/root" "$ver"
echo "vmkernel: $pkg unpacked in $out/root"
