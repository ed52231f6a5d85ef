#!/usr/bin/env bash
# containerd-testbed.sh - a containerd of its own, as a node runs it, for tests.
#
#   containerd-testbed.sh start DIR           containerd with root, state and socket under DIR
#                                             (its CRI plugin off); prints the socket's path
#   containerd-testbed.sh image DIR [REF]     build the test image offline with buildah from
#                                             scratch (busybox-static as /bin), import it (REF,
#                                             default localhost/gpusnap-testbed:1)
#   containerd-testbed.sh import DIR FILE REF an OCI archive (its manifest named by REF's tag) as REF
#   containerd-testbed.sh run DIR ID [CMD...] run a container of that image with the overlayfs
#                                             snapshotter (a real writable layer); prints its
#                                             init's host pid
#   containerd-testbed.sh stop DIR            end every container, then containerd; remove DIR
#
# image: TESTBED_IMAGE_FILES="src:dst ..." copies more files into the image (a
# file's mode is kept, its directories made). Importing DIR/image.tar again
# under another name with the same tag makes a second image of that content.
# run: TESTBED_IMAGE (the image, default the one above), TESTBED_MOUNTS and
# TESTBED_RO_MOUNTS ("src:dst ..." bind mounts, read-write and read-only),
# TESTBED_ENV ("K=V ..."), TESTBED_CWD, TESTBED_NET_HOST=1 (the host's network).
# Every container carries the annotation io.kubernetes.cri.image-name=<image>
# in its bundle's config.json, as containerd's CRI plugin sets it.
#
# Nothing reaches outside: the image is made from Debian's busybox-static, its
# layers never leave the machine, and containerd listens only on DIR's socket.
# A container's writable layer is the upperdir of the overlay mounted at its
# root (/proc/PID/mountinfo); its cgroup is /<namespace>/<id>.
set -euo pipefail

die() { printf 'containerd-testbed: error: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '3,22p' "$0" | sed 's/^# \{0,1\}//'; }

[ $# -ge 2 ] || { usage >&2; exit 2; }
cmd=$1 dir=$2
shift 2
sock=$dir/containerd.sock
ctr_() { ctr -a "$sock" "$@"; }
buildah_() { buildah --storage-driver vfs --root "$dir/buildah/root" --runroot "$dir/buildah/run" "$@"; }

case "$cmd" in
  start)
    [ "$(id -u)" -eq 0 ] || die "run as root"
    command -v containerd >/dev/null || die "containerd is not installed (Debian package containerd)"
    mkdir -p "$dir/root" "$dir/state"
    cat >"$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$sock"
EOF
    containerd --config "$dir/config.toml" >"$dir/containerd.log" 2>&1 &
    echo $! >"$dir/containerd.pid"
    for _ in $(seq 1 100); do
      ctr_ version >/dev/null 2>&1 && { echo "$sock"; exit 0; }
      kill -0 "$(cat "$dir/containerd.pid")" 2>/dev/null || die "containerd exited: $(tail -3 "$dir/containerd.log")"
      sleep 0.1
    done
    die "containerd did not answer on $sock within 10 s"
    ;;
  image)
    ref=${1:-localhost/gpusnap-testbed:1}
    command -v buildah >/dev/null || die "buildah is not installed (Debian package buildah)"
    [ -x /usr/bin/busybox ] || die "busybox is not installed (Debian package busybox-static)"
    b=$(buildah_ from scratch)
    trap 'buildah_ rm "$b" >/dev/null 2>&1 || true' EXIT
    m=$(buildah_ mount "$b")
    mkdir -p "$m/bin" "$m/tmp" "$m/cache" "$m/etc"
    cp /usr/bin/busybox "$m/bin/busybox"
    for a in sh ls cat echo sleep rm mkdir wget sha256sum test cp mv ln awk date pwd env cmp head wc; do
      ln -sf busybox "$m/bin/$a"
    done
    for f in ${TESTBED_IMAGE_FILES:-}; do
      src=${f%%:*} dst=${f#*:}
      [ -f "$src" ] || die "no file $src to copy into the image"
      mkdir -p "$m$(dirname "$dst")"
      cp -p "$src" "$m$dst"
    done
    buildah_ umount "$b" >/dev/null
    buildah_ config --env PATH=/bin --cmd '["/bin/sh"]' "$b"
    # The archive names its manifest by the tag alone; ctr prefixes the name.
    # (ctr 1.6's --index-name loses the index it writes now and then.)
    buildah_ commit -q --format oci "$b" "oci-archive:$dir/image.tar:${ref##*:}" >/dev/null
    "$0" import "$dir" "$dir/image.tar" "$ref"
    ;;
  import)
    [ $# -ge 2 ] || die "import needs an archive and a reference"
    ctr_ images import --base-name "${2%:*}" "$1" >/dev/null
    ctr_ images ls -q | grep -qx "$2" || die "the import of $1 named no image $2"
    echo "$2"
    ;;
  run)
    [ $# -ge 1 ] || die "run needs a container id"
    id=$1
    shift
    ref=${TESTBED_IMAGE:-localhost/gpusnap-testbed:1}
    [ $# -gt 0 ] || set -- /bin/sleep 1000000
    opts=(--annotation "io.kubernetes.cri.image-name=$ref")
    for m in ${TESTBED_MOUNTS:-}; do opts+=(--mount "type=bind,src=${m%%:*},dst=${m#*:},options=rbind:rw"); done
    for m in ${TESTBED_RO_MOUNTS:-}; do opts+=(--mount "type=bind,src=${m%%:*},dst=${m#*:},options=rbind:ro"); done
    for e in ${TESTBED_ENV:-}; do opts+=(--env "$e"); done
    [ -z "${TESTBED_CWD:-}" ] || opts+=(--cwd "$TESTBED_CWD")
    [ "${TESTBED_NET_HOST:-0}" != 1 ] || opts+=(--net-host)
    ctr_ run -d --snapshotter overlayfs "${opts[@]}" "$ref" "$id" "$@" >"$dir/$id.out" 2>&1 ||
      die "ctr run $id failed: $(tail -3 "$dir/$id.out")"
    ctr_ task ls | awk -v id="$id" '$1 == id { print $2 }'
    ;;
  stop)
    if [ -S "$sock" ]; then
      for id in $(ctr_ task ls -q 2>/dev/null); do ctr_ task kill -s KILL "$id" 2>/dev/null || true; done
      sleep 0.5
      for id in $(ctr_ containers ls -q 2>/dev/null); do
        ctr_ task rm -f "$id" >/dev/null 2>&1 || true
        ctr_ containers rm "$id" >/dev/null 2>&1 || true
      done
    fi
    if [ -f "$dir/containerd.pid" ]; then
      pid=$(cat "$dir/containerd.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    # Whatever containerd and buildah left mounted under DIR goes before DIR does.
    { grep -o " $dir/[^ ]*" /proc/self/mountinfo || true; } | sort -r | while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
    rm -rf "$dir"
    ;;
  *) usage >&2; exit 2 ;;
esac
