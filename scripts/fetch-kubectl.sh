#!/usr/bin/env bash
# fetch-kubectl.sh - put Debian's kubectl at build/tools/kubectl for the tests.
#
# The webhook tests apply every JSONPatch they produce with the real
# `kubectl patch --local --type=json`. Debian 12 ships kubectl only as the old
# kubernetes-client 1.20, and a kubectl already on a machine may come from
# elsewhere (or be a dispatcher that needs a network), so this script takes the
# kubectl package of a newer Debian suite, extracts the one binary and installs
# nothing on the host. apt runs with a private configuration under
# $GPUSNAP_CACHE; the host's /etc/apt is not read. Idempotent. See --help.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)
CACHE=${GPUSNAP_CACHE:-/var/cache/gpusnap}
MIRROR=${GPUSNAP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KEYRING=${GPUSNAP_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
SUITES=${GPUSNAP_KUBECTL_SUITES:-trixie bookworm}
ARCH=amd64

log() { printf '[fetch-kubectl] %s\n' "$*"; }
warn() { printf '[fetch-kubectl] warning: %s\n' "$*" >&2; }
die() { printf '[fetch-kubectl] error: %s\n' "$*" >&2; exit 1; }

usage() {
    cat <<EOF
Usage: $0 [--force] [OUTPUT]

Extracts kubectl from Debian's kubectl package (suites tried in order:
$SUITES; in older suites the package is kubernetes-client) into OUTPUT
(default: $REPO_DIR/build/tools/kubectl). Does nothing when OUTPUT already
runs. OUTPUT.version records the package it came from.

Environment: GPUSNAP_CACHE, GPUSNAP_DEBIAN_MIRROR, GPUSNAP_DEBIAN_KEYRING,
GPUSNAP_KUBECTL_SUITES.
EOF
}

FORCE=0
OUTPUT=
while (($#)); do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --force) FORCE=1 ;;
        -*) die "unknown option: $1 (see --help)" ;;
        *) [[ -z $OUTPUT ]] || die "more than one OUTPUT given"; OUTPUT=$1 ;;
    esac
    shift
done
OUTPUT=${OUTPUT:-$REPO_DIR/build/tools/kubectl}
[[ $OUTPUT == /* ]] || OUTPUT=$PWD/$OUTPUT

works() { [[ -x $1 ]] && timeout 30 "$1" version --client >/dev/null 2>&1; }

if ((!FORCE)) && works "$OUTPUT"; then
    log "kubectl up to date: $OUTPUT ($(cat "$OUTPUT.version" 2>/dev/null || echo unknown))"
    exit 0
fi
for tool in apt-get apt-cache dpkg-deb flock timeout; do
    command -v "$tool" >/dev/null || die "missing $tool (Debian packages apt, dpkg, util-linux, coreutils)"
done
[[ -r $KEYRING ]] || die "missing $KEYRING (Debian package debian-archive-keyring)"

mkdir -p "$CACHE/debs" "$(dirname "$OUTPUT")"
exec 9>"$CACHE/.fetch-kubectl.lock"
flock 9
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/fetch-kubectl.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT

PROXY=
eval "$(apt-config shell PROXY Acquire::http::Proxy 2>/dev/null || true)"

# apt with a private configuration: nothing from /etc/apt but the proxy.
apt_in() {   # apt_in SUITE apt-xxx ARGS...
    local suite=$1 cmd=$2 dir=$CACHE/apt-kubectl-$1
    shift 2
    mkdir -p "$dir"/etc/{apt.conf.d,preferences.d,sources.list.d,trusted.gpg.d} \
             "$dir"/state/lists/partial "$dir"/cache/archives/partial
    : >>"$dir/state/status"
    echo "deb [arch=$ARCH signed-by=$KEYRING] $MIRROR $suite main" >"$dir/etc/sources.list"
    printf 'Dir::Etc "%s/etc";\nDir::Etc::main "%s/etc/none.conf";\nDir::Etc::Parts "%s/etc/apt.conf.d";\n' \
        "$dir" "$dir" "$dir" >"$dir/etc/apt.conf"
    local opts=(-o "Dir::State=$dir/state" -o "Dir::State::status=$dir/state/status"
                -o "Dir::Cache=$dir/cache" -o "APT::Architecture=$ARCH" -o "APT::Architectures::=$ARCH"
                -o "Acquire::Languages=none" -o "Acquire::PDiffs=false")
    [[ $(id -u) != 0 ]] || opts+=(-o "APT::Sandbox::User=root")
    [[ -z $PROXY ]] || opts+=(-o "Acquire::http::Proxy=$PROXY")
    APT_CONFIG=$dir/etc/apt.conf "$cmd" "${opts[@]}" "$@"
}

candidate() {   # candidate SUITE PKG: apt's candidate version, or ""
    apt_in "$1" apt-cache policy "$2" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" { print $2 }'
}

try_suite() {   # try_suite SUITE: installs OUTPUT from SUITE or returns 1
    local suite=$1 pkg ver deb bin
    log "updating package lists for $suite"
    if ! apt_in "$suite" apt-get -q update >"$STAGE/update.log" 2>&1 || grep -q '^E:' "$STAGE/update.log"; then
        sed 's/^/    /' "$STAGE/update.log" >&2
        compgen -G "$CACHE/apt-kubectl-$suite/state/lists/*_Packages" >/dev/null || return 1
        warn "apt-get update for $suite failed; using the cached package lists"
    fi
    for pkg in kubectl kubernetes-client; do
        ver=$(candidate "$suite" "$pkg")
        [[ -n $ver ]] || continue
        deb=$(compgen -G "$CACHE/debs/${pkg}_${ver//:/%3a}_*.deb" | head -n1 || true)
        if [[ -z $deb ]]; then
            log "downloading $pkg $ver from $suite"
            mkdir -p "$STAGE/dl"
            (cd "$STAGE/dl" && apt_in "$suite" apt-get -q download "$pkg=$ver") >"$STAGE/dl.log" 2>&1 ||
                { sed 's/^/    /' "$STAGE/dl.log" >&2; continue; }
            deb=$(compgen -G "$STAGE/dl/${pkg}_*.deb" | head -n1) || continue
            mv "$deb" "$CACHE/debs/" && deb=$CACHE/debs/$(basename "$deb")
        fi
        rm -rf "$STAGE/x" && dpkg-deb -x "$deb" "$STAGE/x"
        bin=$STAGE/x/usr/bin/kubectl
        [[ -f $bin && ! -L $bin ]] || { warn "$pkg $ver has no usr/bin/kubectl"; continue; }
        works "$bin" || { warn "kubectl from $pkg $ver does not run here"; continue; }
        install -m 755 "$bin" "$OUTPUT.new" && mv -f "$OUTPUT.new" "$OUTPUT"
        echo "$pkg $ver ($suite)" >"$OUTPUT.version"
        log "installed $OUTPUT: $pkg $ver ($suite)"
        return 0
    done
    return 1
}

for suite in $SUITES; do
    [[ $suite =~ ^[a-z][a-z0-9-]*$ ]] || die "not a Debian suite name: '$suite'"
    try_suite "$suite" && exit 0
    warn "no usable kubectl in $suite"
done
die "no suite gave a kubectl that runs here (tried: $SUITES)"
