# Shared by scripts/image.sh and scripts/image-base.sh (sourced): messages, the skip rule and the
# reproducible layer tar.
say() { echo "image: $*"; }
fail() { echo "image: $*" >&2; exit 1; }
cannot() {  # cannot build here: skip for ctest (77), unless CI requires the image
  echo "image: $* -- image not built" >&2
  [ "${TRELLIS_IMAGE_REQUIRED:-0}" = 1 ] && exit 1
  exit 77
}
iso() { date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ; }

# A layer tar that depends on the tree's content only: names sorted, owners numeric, times
# clamped to EPOCH, no atime/ctime. Top-level entries without "./", as image builders write them.
layer_tar() {  # DIR EPOCH OUT
  local entries
  mapfile -t entries < <(cd "$1" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | LC_ALL=C sort)
  LC_ALL=C tar --create --file="$3" --directory="$1" --sort=name --format=pax \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    --mtime="@$2" --clamp-mtime --numeric-owner --one-file-system "${entries[@]}"
}
