#!/usr/bin/env bash
# build-image.sh - the OCI image deploy/ names `gpusnap`, built offline with
# Debian's buildah from the portable pack (scripts/pack-portable.sh).
#
#   scripts/build-image.sh [--tag REF] [--pack DIR] [--oci-archive FILE] [--push DEST] [--authfile F]
#                          [--dest-tls-verify=false]
#
# The image (docs/KUBERNETES.md): the node bundle in /opt/gpusnap (bin/gpusnap,
# lib/libgpusnap_gpushare.so, criu-bundle/, as the agent's init container
# copies it), gpusnap on PATH, glibc and a busybox /bin/sh (the init
# container's shell) taken from this machine's Debian packages. Nothing is
# downloaded: the image is from scratch.
#   --tag REF          the image's name in buildah's storage (default localhost/gpusnap:<version>)
#   --pack DIR         a portable pack (default: build/portable, made with pack-portable.sh when missing)
#   --oci-archive F    also write the image as an OCI archive (for `ctr images import`, skopeo)
#   --push DEST        push it, e.g. docker://registry.example:5000/gpusnap:0.1.0 (skopeo's transports)
#   --authfile F       registry credentials for --push (a docker config.json); never printed
#   --storage DIR      buildah's storage root (default buildah's own); its run root beside it
set -euo pipefail

REPO_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { printf 'build-image: error: %s\n' "$*" >&2; exit 1; }
log() { printf '[image] %s\n' "$*" >&2; }
usage() { sed -n '5,18p' "$0" | sed 's/^# \{0,1\}//'; }

tag="" pack="" archive="" push="" authfile="" tls_verify=true storage=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --pack) pack=${2:?--pack needs a directory}; shift 2 ;;
    --oci-archive) archive=${2:?--oci-archive needs a file}; shift 2 ;;
    --push) push=${2:?--push needs a destination}; shift 2 ;;
    --authfile) authfile=${2:?--authfile needs a file}; shift 2 ;;
    --dest-tls-verify=false) tls_verify=false; shift ;;
    --storage) storage=${2:?--storage needs a directory}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option \`$1\`" ;;
  esac
done
command -v buildah >/dev/null || die "buildah is not installed (Debian package buildah; scripts/setup.sh installs it)"
[ -x /usr/bin/busybox ] || die "busybox is not installed (Debian package busybox-static)"
[ -z "$authfile" ] || [ -r "$authfile" ] || die "--authfile \`$authfile\` cannot be read"

if [ -z "$pack" ]; then
  pack=$REPO_DIR/build/portable
  [ -x "$pack/gpusnap" ] || { log "no pack in $pack: making one"; "$REPO_DIR/scripts/pack-portable.sh" "$pack" >&2; }
fi
[ -x "$pack/gpusnap" ] && [ -d "$pack/criu-bundle" ] && [ -f "$pack/libgpusnap_gpushare.so" ] ||
  die "\`$pack\` is not a portable pack (gpusnap, criu-bundle/, libgpusnap_gpushare.so): run scripts/pack-portable.sh"
version=$("$pack/gpusnap" version | awk 'NR == 1 { print $2 }')
[ -n "$tag" ] || tag=localhost/gpusnap:${version:-dev}

# vfs: plain copies, nothing for the storage to mount (no fuse-overlayfs needed, any filesystem).
B=(buildah --storage-driver vfs)
[ -z "$storage" ] || B+=(--root "$storage/root" --runroot "$storage/run")
ctr=$("${B[@]}" from scratch)
trap '"${B[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
mnt=$("${B[@]}" mount "$ctr")

# The base: the dynamic loader and the glibc libraries gpusnap links (the pack
# carries every other library), and busybox for the init container's shell.
mkdir -p "$mnt/lib64" "$mnt/lib/x86_64-linux-gnu" "$mnt/bin" "$mnt/usr/local/bin" "$mnt/tmp" "$mnt/etc"
chmod 1777 "$mnt/tmp"
cp -L /lib64/ld-linux-x86-64.so.2 "$mnt/lib64/"
for lib in $(ldd "$pack/gpusnap" | awk '$3 ~ "^/lib/x86_64-linux-gnu/" { print $3 }'); do cp -L "$lib" "$mnt/lib/x86_64-linux-gnu/"; done
cp /usr/bin/busybox "$mnt/bin/busybox"
for applet in sh cp mv rm mkdir cat ls ln echo test; do ln -s busybox "$mnt/bin/$applet"; done
echo "root:x:0:0:root:/:/bin/sh" >"$mnt/etc/passwd"

# The node bundle. bin/gpusnap is a link: run through it, gpusnap finds its
# libraries (RPATH $ORIGIN/lib) and its CRIU bundle beside its real path.
cp -a "$pack/." "$mnt/opt/gpusnap/" 2>/dev/null || { mkdir -p "$mnt/opt/gpusnap"; cp -a "$pack/." "$mnt/opt/gpusnap/"; }
rm -rf "$mnt/opt/gpusnap/workloads" "$mnt/opt/gpusnap/tools"
mkdir -p "$mnt/opt/gpusnap/bin"
ln -s ../gpusnap "$mnt/opt/gpusnap/bin/gpusnap"
cp "$pack/libgpusnap_gpushare.so" "$mnt/opt/gpusnap/lib/libgpusnap_gpushare.so"
ln -s /opt/gpusnap/gpusnap "$mnt/usr/local/bin/gpusnap"
"${B[@]}" umount "$ctr" >/dev/null

"${B[@]}" config --env PATH=/usr/local/bin:/bin --cmd '["gpusnap", "--help"]' \
  --label "org.opencontainers.image.title=gpusnap" --label "org.opencontainers.image.version=$version" "$ctr"
"${B[@]}" commit -q --format oci "$ctr" "$tag" >/dev/null
log "built $tag (gpusnap $version)"
if [ -n "$archive" ]; then
  rm -f "$archive"
  "${B[@]}" push -q "$tag" "oci-archive:$archive:${tag##*:}" >/dev/null
  log "wrote $archive"
fi
if [ -n "$push" ]; then
  args=(--tls-verify="$tls_verify")
  [ -z "$authfile" ] || args+=(--authfile "$authfile")
  "${B[@]}" push -q "${args[@]}" "$tag" "$push" >/dev/null || die "pushing $tag to $push failed"
  log "pushed $tag to $push"
fi
echo "$tag"
