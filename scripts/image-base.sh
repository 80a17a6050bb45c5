#!/usr/bin/env bash
# The Debian layer of the runtime image (called by scripts/image.sh): Debian 12 from the archive
# this machine's apt uses, made by mmdebstrap (variant apt: Essential packages + apt) with the
# runtime packages of scripts/image-packages.txt, slim like debian:12-slim, and the user trellis
# (uid/gid 1000). Prints the layer tar, OUT_DIR/base-<key>.tar (cached), and its epoch; the key hashes
# this script, image-lib.sh, the package list and the mirrors, so editing anything else reuses it.
# Its SOURCE_DATE_EPOCH is BASE_EPOCH below, part of the definition (not the commit time, which
# would change the layer with every commit): the same definition and the same archive content
# give the same bytes. Security updates: `rm build/image/base-*.tar` (or a changed definition).
# Usage: scripts/image-base.sh OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/image-lib.sh"
out=$1
mkdir -p "$out"

# A killed mmdebstrap can leave /dev, /proc, /sys mounted in its chroot: unmount them before
# removing it, or rm -rf would walk into the host's /dev.
mounts_under() { awk -v d="$1/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | LC_ALL=C sort -r; }
remove_chroot() {
  local m
  for m in $(mounts_under "$1"); do
    umount -l "$m"
  done
  [ -z "$(mounts_under "$1")" ] || fail "$1 still has mounts under it; not removing it"
  rm -rf "$1"
}

packages=$(sed 's/#.*//' "$here/image-packages.txt" | xargs | tr ' ' ,)
# The Debian suites of this machine's apt sources (the one archive the build may reach).
mapfile -t mirrors < <(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' 2>/dev/null |
                       awk '$2 ~ /^bookworm(-updates|-security)?$/ {print "deb " $1 " " $2 " main"}' | LC_ALL=C sort -u)
[ ${#mirrors[@]} -gt 0 ] || mirrors=("deb http://deb.debian.org/debian bookworm main"
                                     "deb http://deb.debian.org/debian bookworm-updates main"
                                     "deb http://deb.debian.org/debian-security bookworm-security main")
key=$( (cat "$here/image-base.sh" "$here/image-lib.sh" "$here/image-packages.txt"; printf '%s\n' "${mirrors[@]}") |
      sha256sum | cut -c1-16)
base=$out/base-$key.tar
epoch=1747699200  # BASE_EPOCH, 2025-05-20T00:00:00Z; move it forward with the package list
if [ -f "$base" ]; then
  echo "$base $epoch"
  exit 0
fi

say "building the Debian layer (mmdebstrap: minutes, most of it python3-torch and what it pulls)" >&2
r=$out/rootfs-tmp
remove_chroot "$r"
rm -rf "$out"/base-*
t0=$(date +%s)
# dpkg options (kept in /etc/dpkg/dpkg.cfg.d/99mmdebstrap for images built FROM this one): no
# manuals, docs but the copyrights, translations; force-unsafe-io: no fsync per unpacked file.
if ! SOURCE_DATE_EPOCH=$epoch mmdebstrap --variant=apt --mode=root --format=directory \
       --dpkgopt=force-unsafe-io --dpkgopt='path-exclude=/usr/share/man/*' \
       --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
       --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
       --include="$packages" bookworm "$r" "${mirrors[@]}" >"$out/mmdebstrap.log" 2>&1; then
  tail -20 "$out/mmdebstrap.log" >&2
  remove_chroot "$r"
  if grep -qiE 'failed to fetch|could not resolve|temporary failure resolving|unable to connect|apt-get update failed|connection (timed out|refused)' "$out/mmdebstrap.log"; then
    cannot "mmdebstrap cannot reach the Debian archive (${mirrors[0]}; log: $out/mmdebstrap.log)"
  fi
  fail "mmdebstrap failed (log: $out/mmdebstrap.log)"
fi
# What a container runtime provides (/dev, hostname, resolv.conf) or the build left behind.
[ -z "$(mounts_under "$r")" ] || fail "mmdebstrap left mounts under $r"
rm -rf "$r"/dev/* "$r"/etc/hostname "$r"/etc/resolv.conf "$r"/var/cache/debconf/*-old "$r"/var/lib/dpkg/*-old
find "$r"/var/cache/apt "$r"/var/lib/apt/lists "$r"/var/log -type f -delete
# The user of every process (the chart's runAsUser), written directly: no shadow dates.
echo 'trellis:x:1000:1000:Trellis:/home/trellis:/bin/sh' >>"$r/etc/passwd"
echo 'trellis:x:1000:' >>"$r/etc/group"
echo 'trellis:*:0:0:99999:7:::' >>"$r/etc/shadow"
install -d -m 0755 -o 1000 -g 1000 "$r/home/trellis"
layer_tar "$r" "$epoch" "$base.tmp"
remove_chroot "$r"
mv "$base.tmp" "$base"
say "Debian layer in $(( $(date +%s) - t0 )) s: $(du -m "$base" | cut -f1) MiB uncompressed" >&2
echo "$base $epoch"
