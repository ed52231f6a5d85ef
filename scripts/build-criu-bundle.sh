#!/usr/bin/env bash
# shellcheck disable=SC2016,SC2317  # $ORIGIN is literal; cleanup() runs from a trap
# build-criu-bundle.sh - build a self-contained CRIU bundle from Debian packages.
#
# Debian 12's own criu (3.17) does not work on the kernels gpusnap targets, so
# this script takes criu from a newer Debian suite and makes it runnable on the
# host without installing anything: the binary, every shared library it needs
# and the suite's own glibc loader are copied into one directory, and every ELF
# gets an $ORIGIN-relative search path. Run `--help` for usage.
set -euo pipefail

PROG=build-criu-bundle
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/.." && pwd)

CACHE=${GPUSNAP_CACHE:-/var/cache/gpusnap}
MIRROR=${GPUSNAP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
HOST_KEYRING=${GPUSNAP_DEBIAN_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
DEFAULT_SUITES=${GPUSNAP_CRIU_SUITES:-experimental sid trixie}
ARCH=amd64
MULTIARCH=x86_64-linux-gnu
LOADER=ld-linux-x86-64.so.2
# Libraries that are dlopen()ed rather than listed in DT_NEEDED but that we
# still want inside the bundle (glibc loads libgcc_s for thread cancellation
# and backtraces).
EXTRA_SONAMES=(libgcc_s.so.1)

log() { printf '[criu-bundle] %s\n' "$*"; }
warn() { printf '[criu-bundle] warning: %s\n' "$*" >&2; }
die() { printf '[criu-bundle] error: %s\n' "$*" >&2; exit 1; }

usage() {
    cat <<EOF
Usage: $0 [options] [OUTDIR]

Builds a self-contained CRIU bundle (criu + checkpointctl + the libraries and
glibc loader they need) from Debian packages and writes it to OUTDIR
(default: $REPO_DIR/build/criu-bundle).

Suites are tried newest first ($DEFAULT_SUITES); the first whose bundle passes
'criu check' on this machine is kept. Nothing is installed on the host and the
host's /etc/apt is not used: apt runs with a private configuration under
\$GPUSNAP_CACHE (default /var/cache/gpusnap), where the downloaded packages are
cached as well.

Options:
  --force         rebuild even if OUTDIR already holds a working bundle
  --suite SUITE   only try SUITE (may be repeated; default: $DEFAULT_SUITES)
  -h, --help      show this help

Environment:
  GPUSNAP_CACHE           cache directory (default /var/cache/gpusnap)
  GPUSNAP_DEBIAN_MIRROR   Debian mirror (default http://deb.debian.org/debian)
  GPUSNAP_DEBIAN_KEYRING  archive keyring (default $HOST_KEYRING)
  GPUSNAP_CRIU_SUITES     suites to try, newest first

Bundle layout:
  OUTDIR/criu, OUTDIR/checkpointctl   shell wrappers for interactive use
  OUTDIR/bin/                         the binaries (RPATH \$ORIGIN/../lib)
  OUTDIR/lib/                         shared libraries and $LOADER
  OUTDIR/share/rpc.proto              CRIU RPC protocol of the same version
  OUTDIR/VERSION, OUTDIR/manifest.txt

Programs should run the binaries through the bundled loader, e.g.
  OUTDIR/lib/$LOADER OUTDIR/bin/criu check
EOF
}

# ---------------------------------------------------------------- arguments
FORCE=0
SUITES=()
SUITES_GIVEN=0
OUTDIR=
while (($#)); do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --force) FORCE=1 ;;
        --suite) (($# >= 2)) || die "--suite needs an argument"; SUITES+=("$2"); shift ;;
        --suite=*) SUITES+=("${1#--suite=}") ;;
        -*) die "unknown option: $1 (see --help)" ;;
        *) [[ -z $OUTDIR ]] || die "more than one OUTDIR given"; OUTDIR=$1 ;;
    esac
    shift
done
if ((${#SUITES[@]})); then SUITES_GIVEN=1; else read -r -a SUITES <<<"$DEFAULT_SUITES"; fi
for s in "${SUITES[@]}"; do
    [[ $s =~ ^[a-z][a-z0-9-]*$ ]] || die "not a Debian suite name: '$s'"
done
OUTDIR=${OUTDIR:-$REPO_DIR/build/criu-bundle}
[[ $OUTDIR == /* ]] || OUTDIR=$PWD/$OUTDIR
OUTDIR=${OUTDIR%/}
# OUTDIR gets replaced as a whole: refuse to do that to anything but a bundle.
if [[ -e $OUTDIR || -L $OUTDIR ]]; then
    [[ -d $OUTDIR && ! -L $OUTDIR ]] || die "$OUTDIR exists and is not a directory"
    if [[ -n $(ls -A "$OUTDIR") && ! -e $OUTDIR/VERSION && ! -e $OUTDIR/bin/criu ]]; then
        die "$OUTDIR is not empty and does not look like a criu bundle; refusing to replace it"
    fi
fi

# --------------------------------------------------------- up-to-date check
# Runs the bundle's own 'criu check'; prints its output into $2 (a file).
bundle_check() {
    local dir=$1 out=$2
    [[ -x $dir/criu && -x $dir/bin/criu && -e $dir/lib/$LOADER ]] || {
        echo "incomplete bundle in $dir" >"$out"; return 1; }
    timeout 120 "$dir/criu" check >"$out" 2>&1
}

bundle_current() {
    [[ -s $OUTDIR/VERSION && -s $OUTDIR/share/rpc.proto ]] || return 1
    if ((SUITES_GIVEN)); then
        # An explicit suite list must include the suite the bundle came from.
        local s from
        from=$(sed -n 's/.*, \([^)]*\))$/\1/p' "$OUTDIR/VERSION")
        for s in "${SUITES[@]}"; do [[ $s == "$from" ]] && break; done
        [[ $s == "$from" ]] || return 1
    fi
    local out rc=0
    out=$(mktemp)
    bundle_check "$OUTDIR" "$out" || rc=$?
    rm -f "$out"
    return $rc
}

if ((!FORCE)) && bundle_current; then
    log "criu bundle up to date: $(cat "$OUTDIR/VERSION")"
    exit 0
fi

# ------------------------------------------------------------- prerequisites
[[ $(id -u) == 0 ]] || die "must run as root (criu check needs it)"
missing=()
for pair in patchelf:patchelf readelf:binutils apt-get:apt apt-cache:apt \
            apt-config:apt dpkg:dpkg dpkg-deb:dpkg flock:util-linux \
            timeout:coreutils gpgv:gpgv; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:} (for ${pair%%:*})")
done
[[ -r $HOST_KEYRING ]] || missing+=("debian-archive-keyring (for $HOST_KEYRING)")
if ((${#missing[@]})); then
    die "missing tools; install these Debian packages: ${missing[*]}"
fi
[[ $(dpkg --print-architecture) == "$ARCH" ]] || die "only $ARCH hosts are supported"

mkdir -p "$CACHE/debs" "$(dirname "$OUTDIR")"
exec 9>"$CACHE/.criu-bundle.lock"
if ! flock -n 9; then
    log "another build is running; waiting for it"
    flock 9
    if ((!FORCE)) && bundle_current; then
        log "criu bundle up to date: $(cat "$OUTDIR/VERSION")"
        exit 0
    fi
fi

rm -rf "$CACHE"/debs/partial.*   # left behind by interrupted runs
START=$SECONDS
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/criu-bundle-stage.XXXXXX")
NEWDIR=
cleanup() {
    rm -rf "$STAGE"
    [[ -z $NEWDIR ]] || rm -rf "$NEWDIR"
}
trap cleanup EXIT

# Proxy settings are the one thing taken over from the host's apt config.
HTTP_PROXY_CONF=
eval "$(apt-config shell HTTP_PROXY_CONF Acquire::http::Proxy 2>/dev/null || true)"

# --------------------------------------------------------- private apt config
# apt never reads /etc/apt here: APT_CONFIG points at a private file that
# disables /etc/apt/apt.conf{,.d}, and every directory is overridden with -o.
declare -A SUITE_KEYRING=()   # keyring used for a suite (if not the host's)
declare -A NO_VALID_UNTIL=()  # suites whose Release files are past Valid-Until
APT_OPTS=()
APT_DIR=

apt_select() {   # apt_select SUITE: fills APT_DIR and APT_OPTS
    local suite=$1 keyring=${SUITE_KEYRING[$1]:-$HOST_KEYRING} s
    APT_DIR=$CACHE/apt-$suite
    mkdir -p "$APT_DIR"/{etc/sources.list.d,etc/preferences.d,etc/trusted.gpg.d,etc/apt.conf.d} \
             "$APT_DIR"/{state/lists/partial,cache/archives/partial}
    : >>"$APT_DIR/state/status"
    {
        echo "# written by $PROG; do not edit"
        for s in $(apt_suites "$suite"); do
            echo "deb [arch=$ARCH signed-by=$keyring] $MIRROR $s main"
        done
    } >"$APT_DIR/etc/sources.list"
    cat >"$APT_DIR/etc/apt.conf" <<EOF
// written by $PROG: keep apt away from the host's /etc/apt
Dir::Etc "$APT_DIR/etc";
Dir::Etc::main "$APT_DIR/etc/none.conf";
Dir::Etc::Parts "$APT_DIR/etc/apt.conf.d";
EOF
    APT_OPTS=(
        -o "Dir::Etc::SourceList=$APT_DIR/etc/sources.list"
        -o "Dir::Etc::SourceParts=$APT_DIR/etc/sources.list.d"
        -o "Dir::Etc::Preferences=$APT_DIR/etc/preferences"
        -o "Dir::Etc::PreferencesParts=$APT_DIR/etc/preferences.d"
        -o "Dir::Etc::Trusted=$APT_DIR/etc/trusted.gpg"
        -o "Dir::Etc::TrustedParts=$APT_DIR/etc/trusted.gpg.d"
        -o "Dir::State=$APT_DIR/state"
        -o "Dir::State::Lists=$APT_DIR/state/lists"
        -o "Dir::State::status=$APT_DIR/state/status"
        -o "Dir::Cache=$APT_DIR/cache"
        -o "APT::Architecture=$ARCH"
        -o "APT::Architectures::=$ARCH"
        -o "Acquire::Languages=none"
        -o "Acquire::PDiffs=false"
        -o "APT::Install-Recommends=false"
        -o "APT::Sandbox::User=root"
    )
    [[ -z $HTTP_PROXY_CONF ]] || APT_OPTS+=(-o "Acquire::http::Proxy=$HTTP_PROXY_CONF")
    # Set by apt_update when this mirror's Release files are past Valid-Until.
    [[ -z ${NO_VALID_UNTIL[$suite]:-} ]] || APT_OPTS+=(-o "Acquire::Check-Valid-Until=false")
}

apt_suites() {   # the archive suites that make up one of our "suites"
    case $1 in
        experimental) echo "sid experimental" ;;   # experimental is not complete on its own
        *) echo "$1" ;;
    esac
}

apt_run() {   # apt_run SUITE apt-xxx ARGS...
    local suite=$1 cmd=$2; shift 2
    apt_select "$suite"
    APT_CONFIG=$APT_DIR/etc/apt.conf "$cmd" "${APT_OPTS[@]}" "$@"
}

# Fetch a newer debian-archive-keyring through trixie, which the host keyring
# of an up-to-date bookworm trusts, for suites signed with keys it lacks.
bootstrap_keyring() {
    local dir=$CACHE/keyring deb kr
    [[ $1 != trixie ]] || return 1
    if [[ ! -s $dir/debian-archive-keyring.gpg ]]; then
        log "host keyring does not verify $1; fetching debian-archive-keyring from trixie"
        apt_update trixie || return 1
        fetch_debs trixie "debian-archive-keyring=$(candidate trixie debian-archive-keyring)" || return 1
        rm -rf "$STAGE/keyring" && mkdir -p "$STAGE/keyring" "$dir"
        for deb in "${FETCHED[@]}"; do dpkg-deb -x "$deb" "$STAGE/keyring"; done
        kr=$(find "$STAGE/keyring" -name 'debian-archive-keyring.gpg' -o -name 'debian-archive-keyring.pgp' | head -n1)
        [[ -n $kr ]] || return 1
        cp "$kr" "$dir/debian-archive-keyring.gpg.new"
        mv "$dir/debian-archive-keyring.gpg.new" "$dir/debian-archive-keyring.gpg"
    fi
    SUITE_KEYRING[$1]=$dir/debian-archive-keyring.gpg
}

declare -A UPDATED=()
apt_update() {   # apt_update SUITE: refresh the package lists (once per run)
    local suite=$1 out rc
    [[ -z ${UPDATED[$suite]:-} ]] || return 0
    log "updating package lists for $suite ($(apt_suites "$suite"))"
    out=$STAGE/apt-update-$suite.log
    local _
    for _ in 1 2 3; do
        rc=0; apt_run "$suite" apt-get -q update >"$out" 2>&1 || rc=$?
        if grep -q 'is expired' "$out" && [[ -z ${NO_VALID_UNTIL[$suite]:-} ]]; then
            # Happens with mirror snapshots or a skewed clock. Signatures are
            # still checked; only the freshness limit of the Release file is off.
            warn "$suite: Release file is past its Valid-Until date; ignoring that date"
            NO_VALID_UNTIL[$suite]=1
        elif grep -qE 'NO_PUBKEY|EXPKEYSIG|KEYEXPIRED|is not signed|signature verification failed' "$out" \
                && [[ -z ${SUITE_KEYRING[$suite]:-} ]]; then
            if ! bootstrap_keyring "$suite"; then
                sed 's/^/    /' "$out" >&2
                die "$HOST_KEYRING cannot verify the $suite archive; update the host's keyring: apt-get update && apt-get install debian-archive-keyring"
            fi
            log "retrying $suite with the keyring from trixie's debian-archive-keyring"
        else
            break
        fi
    done
    if ((rc)) || grep -q '^E:' "$out"; then
        sed 's/^/    /' "$out" >&2
        if compgen -G "$APT_DIR/state/lists/*_Packages" >/dev/null; then
            warn "apt-get update for $suite failed; using the cached package lists"
        else
            warn "apt-get update for $suite failed and nothing is cached"
            return 1
        fi
    fi
    UPDATED[$suite]=1
}

# pkg_policy SUITE PKG [VERSION] [RELEASE]: prints "VERSION ARCHIVE" for the
# given version, else the newest version in RELEASE, else apt's candidate.
pkg_policy() {
    apt_run "$1" apt-cache policy "$2" 2>/dev/null | awk -v want="${3:-}" -v rel="${4:-}" '
        $1 == "Candidate:" { if (want == "" && rel == "") want = $2; next }
        (NF == 2 || (NF == 3 && $1 == "***")) && $NF ~ /^-?[0-9]+$/ { v = $(NF - 1); next }
        $NF == "Packages" && v != "" {
            d = $3; sub(/\/.*/, "", d)
            if ((want != "" && v == want) || (want == "" && d == rel)) { print v, d; exit }
        }'
}

candidate() {   # candidate SUITE PKG [RELEASE]: the version to take, or ""
    local r
    r=$(pkg_policy "$1" "$2" "" "${3:-}")
    echo "${r%% *}"
}

# fetch_debs SUITE PKG=VER...: make sure the .debs are in the cache; the
# paths end up in FETCHED (same order).
FETCHED=()
fetch_debs() {
    local suite=$1 spec pkg ver name want=() part
    shift
    FETCHED=()
    for spec in "$@"; do
        pkg=${spec%%=*} ver=${spec#*=}
        name=$(debfile "$pkg" "$ver")
        [[ -n $name ]] || want+=("$spec")
    done
    if ((${#want[@]})); then
        log "downloading ${want[*]}"
        part=$CACHE/debs/partial.$$
        rm -rf "$part" && mkdir -p "$part"
        if ! (cd "$part" && apt_run "$suite" apt-get -q download "${want[@]}") >"$STAGE/download.log" 2>&1; then
            sed 's/^/    /' "$STAGE/download.log" >&2
            rm -rf "$part"
            return 1
        fi
        mv "$part"/*.deb "$CACHE/debs/"
        rm -rf "$part"
    fi
    for spec in "$@"; do
        pkg=${spec%%=*} ver=${spec#*=}
        name=$(debfile "$pkg" "$ver")
        [[ -n $name ]] || { warn "download of $spec produced no file"; return 1; }
        FETCHED+=("$name")
    done
}

debfile() {   # the cached .deb of PKG at VER, named as apt-get download names it
    local f
    for f in "$CACHE/debs/${1}_${2//:/%3a}_"*.deb; do
        [[ -e $f ]] && { echo "$f"; return 0; }
    done
    return 0
}

# ---------------------------------------------------------- building a bundle
declare -A PKG_VER=() PKG_SUITE=() PKG_DIR=() LIB_FROM=()
PKG_ORDER=()

# resolve SUITE RELEASE TARGET...: let apt resolve the dependency closure (a
# dry run against an empty dpkg status) and record the chosen versions.
#
# With RELEASE (experimental), dependencies come from the default suite (sid)
# unless they cannot: a dependency apt reports as unmet is then pinned to its
# RELEASE version and the dry run repeated. (Asking apt for criu/experimental
# instead moves every direct dependency that experimental has - libc6 among
# them - to experimental, and that set is not installable on its own.)
resolve() {
    local suite=$1 release=$2 out line pkg ver dep added ok=0 n
    local -A pinned=()
    shift 2
    local targets=("$@")
    out=$STAGE/resolve-$suite.log
    for n in 1 2 3 4 5 6 7 8; do
        if apt_run "$suite" apt-get -s -q install --no-install-recommends "${targets[@]}" >"$out" 2>&1; then
            ok=1; break
        fi
        added=0
        if [[ -n $release ]]; then
            while read -r dep; do
                [[ -z ${pinned[$dep]:-} ]] || continue
                pinned[$dep]=1
                ver=$(candidate "$suite" "$dep" "$release")
                [[ -n $ver ]] || continue
                log "$suite: taking $dep $ver from $release (needed by ${targets[0]})"
                targets+=("$dep=$ver"); added=1
            done < <(grep -oE '(Pre)?Depends: [a-z0-9][a-z0-9+.-]*' "$out" | awk '{print $2}' | sort -u)
        fi
        if ((!added)); then
            break
        fi
    done
    if ((!ok)); then
        sed 's/^/    /' "$out" >&2
        return 1
    fi
    while read -r line; do
        # Inst libc6 (2.43-7 Debian:unstable [amd64])
        [[ $line =~ ^Inst\ ([^ ]+)\ \(([^ ]+) ]] || continue
        pkg=${BASH_REMATCH[1]} ver=${BASH_REMATCH[2]}
        [[ -z ${PKG_VER[$pkg]:-} ]] || continue
        PKG_VER[$pkg]=$ver PKG_SUITE[$pkg]=$suite
        PKG_ORDER+=("$pkg")
    done <"$out"
}

# unpack SUITE PKG...: download (cached) and dpkg -x into the staging area.
unpack() {
    local suite=$1 pkg specs=() i
    local -A seen=()
    shift
    for pkg in "$@"; do
        [[ -z ${PKG_DIR[$pkg]:-} && -z ${seen[$pkg]:-} ]] || continue
        seen[$pkg]=1
        specs+=("$pkg=${PKG_VER[$pkg]}")
    done
    ((${#specs[@]})) || return 0
    fetch_debs "$suite" "${specs[@]}" || return 1
    for i in "${!specs[@]}"; do
        pkg=${specs[$i]%%=*}
        mkdir -p "$STAGE/pkgs/$pkg"
        dpkg-deb -x "${FETCHED[$i]}" "$STAGE/pkgs/$pkg"
        PKG_DIR[$pkg]=$STAGE/pkgs/$pkg
    done
}

# Follow symlinks inside an unpacked package tree (never into the host's /).
resolve_in_root() {
    local root=$1 p=$2 t n=0
    while [[ -L $p ]]; do
        ((n++ < 20)) || return 1
        t=$(readlink "$p")
        if [[ $t == /* ]]; then p=$root$t; else p=$(dirname "$p")/$t; fi
    done
    [[ -f $p ]] && echo "$p"
}

find_soname() {   # find_soname SONAME: prints "PKG PATH" of the first match
    local so=$1 pkg d f
    for pkg in "${PKG_ORDER[@]}"; do
        [[ -n ${PKG_DIR[$pkg]:-} ]] || continue
        for d in usr/lib/$MULTIARCH lib/$MULTIARCH usr/lib64 lib64 usr/lib lib; do
            f=${PKG_DIR[$pkg]}/$d/$so
            if [[ -e $f || -L $f ]]; then
                f=$(resolve_in_root "${PKG_DIR[$pkg]}" "$f") || continue
                echo "$pkg $f"; return 0
            fi
        done
    done
    return 1
}

# Debian names library packages after the soname (libfoo.so.3 -> libfoo3,
# libfoo-1.2.so.0 -> libfoo-1.2-0, libfoo2.so.1 -> libfoo2-1, plus the t64
# variants of the 64-bit time_t transition). A few do not follow the rule.
guess_packages() {
    local so=$1 base num
    case $so in
        libc.so.6|libm.so.6|libdl.so.2|libpthread.so.0|librt.so.1|libresolv.so.2|libutil.so.1|"$LOADER")
            echo libc6; return ;;
        libgcc_s.so.1) echo libgcc-s1; return ;;
        libstdc++.so.6) echo libstdc++6; return ;;
        libz.so.1) echo zlib1g; return ;;
        libzstd.so.1) echo libzstd1; return ;;
        liblzma.so.5) echo liblzma5; return ;;
    esac
    [[ $so =~ ^(.+)\.so\.([0-9]+)$ ]] || return 0
    base=${BASH_REMATCH[1],,} num=${BASH_REMATCH[2]}
    base=${base//_/-}
    if [[ $base =~ [0-9]$ ]]; then
        echo "$base-$num" "$base-${num}t64"
    else
        echo "$base$num" "$base${num}t64"
    fi
}

# collect_libs SUITE: copy into $NEWDIR/lib every library that the ELFs in
# $NEWDIR/bin and $NEWDIR/lib need (DT_NEEDED), until nothing is missing.
# Packages are unpacked in batches: first those named after a missing soname,
# then the other library packages of the resolved closure, and last packages
# named after the soname that are outside the closure.
collect_libs() {
    local suite=$1 f so hit changed pkg cand ver batch
    local -A needed_of=() needed_by=()
    local missing=()
    while :; do
        changed=0 missing=()
        needed_by=()
        for so in "$LOADER" "${EXTRA_SONAMES[@]}"; do needed_by[$so]=bundle; done
        for f in "$NEWDIR"/bin/* "$NEWDIR"/lib/*; do
            [[ -f $f ]] || continue
            [[ -n ${needed_of[$f]+x} ]] || needed_of[$f]=$(patchelf --print-needed "$f") || return 1
            for so in ${needed_of[$f]}; do needed_by[$so]=${needed_by[$so]:-$(basename "$f")}; done
        done
        for so in "${!needed_by[@]}"; do
            [[ -e $NEWDIR/lib/$so ]] && continue
            if hit=$(find_soname "$so"); then
                pkg=${hit%% *}
                cp "${hit#* }" "$NEWDIR/lib/$so" && chmod u+w "$NEWDIR/lib/$so" || return 1
                LIB_FROM[$so]=$pkg changed=1
            else
                missing+=("$so")
            fi
        done
        ((changed)) && continue
        ((${#missing[@]})) || return 0

        batch=()
        for so in "${missing[@]}"; do
            for cand in $(guess_packages "$so"); do
                [[ -n ${PKG_VER[$cand]:-} && -z ${PKG_DIR[$cand]:-} ]] && batch+=("$cand")
            done
        done
        if ((${#batch[@]} == 0)); then
            for pkg in "${PKG_ORDER[@]}"; do
                [[ -z ${PKG_DIR[$pkg]:-} && $pkg =~ ^(lib|zlib) && ! $pkg =~ -(dev|bin|common|data|doc|utils|tools)$ ]] &&
                    batch+=("$pkg")
            done
        fi
        if ((${#batch[@]} == 0)); then
            for so in "${missing[@]}"; do
                for cand in $(guess_packages "$so"); do
                    [[ -z ${PKG_VER[$cand]:-} ]] || continue
                    ver=$(candidate "$suite" "$cand")
                    [[ -n $ver ]] || continue
                    PKG_VER[$cand]=$ver PKG_SUITE[$cand]=$suite
                    PKG_ORDER+=("$cand") batch+=("$cand")
                done
            done
        fi
        if ((${#batch[@]} == 0)); then
            for so in "${missing[@]}"; do
                warn "$suite: no package provides $so (needed by ${needed_by[$so]}); add it to guess_packages() in $0"
            done
            return 1
        fi
        unpack "$suite" "${batch[@]}" || return 1
    done
}

write_wrapper() {
    cat >"$NEWDIR/$1" <<EOF
#!/bin/sh
# Runs the bundled $1 with the bundle's own glibc loader (no host libraries).
d=\$(dirname "\$(readlink -f "\$0")")
exec "\$d/lib/$LOADER" "\$d/bin/$1" "\$@"
EOF
    chmod 755 "$NEWDIR/$1"
}

# build_suite SUITE: builds a bundle into $NEWDIR; returns non-zero with a
# message if the suite has no usable criu.
build_suite() {
    local suite=$1 release="" ver ctl_ver ctl_suite="" pkg f so proto pins
    PKG_VER=() PKG_SUITE=() PKG_DIR=() LIB_FROM=() PKG_ORDER=()
    apt_update "$suite" || return 1
    [[ $suite == experimental ]] && release=experimental
    ver=$(candidate "$suite" criu "$release")
    [[ -n $ver ]] || { warn "$suite has no criu package"; return 1; }
    log "$suite: criu $ver"
    # Exact-version dependencies (libcompel1 (= 4.3-1~exp2)) come from the
    # same source package: ask for them up front.
    pins=$(apt_run "$suite" apt-cache show "criu=$ver" 2>/dev/null |
           sed -n 's/^Depends: //p' | head -n1 | tr ',' '\n' |
           sed -n 's/^ *\([a-z0-9][a-z0-9+.-]*\) (= \([^)]*\)).*/\1=\2/p')
    # shellcheck disable=SC2086  # $pins is a list of words
    resolve "$suite" "$release" "criu=$ver" $pins || { warn "$suite: cannot resolve the dependencies of criu $ver"; return 1; }

    # checkpointctl (a Go program, needs only libc) from the same suite, else trixie.
    ctl_ver=$(candidate "$suite" checkpointctl)
    if [[ -n $ctl_ver ]]; then
        ctl_suite=$suite
    elif [[ $suite != trixie ]] && apt_update trixie; then
        ctl_ver=$(candidate trixie checkpointctl)
        [[ -z $ctl_ver ]] || ctl_suite=trixie
    fi
    if [[ -n $ctl_suite ]]; then
        PKG_VER[checkpointctl]=$ctl_ver PKG_SUITE[checkpointctl]=$ctl_suite
        PKG_ORDER+=(checkpointctl)
        log "$suite: checkpointctl $ctl_ver"
    else
        ctl_suite=
        warn "no usable checkpointctl package; the bundle will not have it"
    fi

    [[ -n ${PKG_VER[libc6]:-} ]] || { warn "$suite: libc6 missing from the closure of criu"; return 1; }
    unpack "$suite" criu libc6 || return 1
    [[ -z $ctl_suite ]] || unpack "$ctl_suite" checkpointctl || return 1
    # rpc.proto must match the criu version: libcriu-dev of the same source.
    PKG_VER[libcriu-dev]=$ver PKG_SUITE[libcriu-dev]=$suite
    unpack "$suite" libcriu-dev || { warn "$suite: no libcriu-dev $ver"; return 1; }
    proto=$(find "${PKG_DIR[libcriu-dev]}" -name rpc.proto | head -n1)
    [[ -n $proto ]] || { warn "$suite: libcriu-dev $ver has no rpc.proto"; return 1; }

    mkdir -p "$NEWDIR"/{bin,lib,share}
    cp "$proto" "$NEWDIR/share/rpc.proto" || return 1
    for f in usr/sbin/criu sbin/criu usr/bin/criu; do
        [[ -f ${PKG_DIR[criu]}/$f ]] && { cp "${PKG_DIR[criu]}/$f" "$NEWDIR/bin/criu" || return 1; break; }
    done
    [[ -f $NEWDIR/bin/criu ]] || { warn "$suite: no criu binary in the criu package"; return 1; }
    if [[ -n $ctl_suite && -f ${PKG_DIR[checkpointctl]}/usr/bin/checkpointctl ]]; then
        cp "${PKG_DIR[checkpointctl]}/usr/bin/checkpointctl" "$NEWDIR/bin/checkpointctl" || return 1
    fi

    log "$suite: collecting shared libraries"
    collect_libs "$suite" || return 1

    # $ORIGIN search paths, as DT_RPATH (not RUNPATH) so that an
    # LD_LIBRARY_PATH in the caller's environment cannot pull host libraries in.
    for f in "$NEWDIR"/bin/*; do
        readelf -l "$f" 2>/dev/null | grep -q 'Requesting program interpreter' ||
            { warn "$f is not a dynamically linked executable"; return 1; }
        patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f" || return 1
        write_wrapper "$(basename "$f")"
    done
    for f in "$NEWDIR"/lib/*; do
        [[ $(basename "$f") == "$LOADER" ]] && continue
        patchelf --force-rpath --set-rpath '$ORIGIN' "$f" || return 1
    done
    chmod 755 "$NEWDIR"/bin/* "$NEWDIR"/lib/*

    local upstream=${ver#*:}
    upstream=${upstream%-*}
    echo "criu $upstream ($ver, $suite)" >"$NEWDIR/VERSION"
    {
        echo "# packages in this bundle: name version archive"
        for pkg in criu checkpointctl libcriu-dev $(printf '%s\n' "${LIB_FROM[@]}" | sort -u); do
            [[ $pkg == checkpointctl && -z $ctl_suite ]] && continue
            echo "$pkg $(pkg_policy "${PKG_SUITE[$pkg]}" "$pkg" "${PKG_VER[$pkg]}")"
        done
        echo "# files in lib/: soname package"
        for so in $(printf '%s\n' "${!LIB_FROM[@]}" | sort); do
            echo "# $so ${LIB_FROM[$so]}"
        done
    } >"$NEWDIR/manifest.txt"
}

# Every library the bundled binaries load must come from the bundle.
check_isolation() {
    local f line path bad=0
    for f in "$NEWDIR"/bin/*; do
        while read -r line; do
            [[ $line == *"=> not found"* ]] && { warn "$line"; bad=1; continue; }
            [[ $line =~ =\>\ (/[^ ]+) ]] || continue
            path=$(readlink -f "${BASH_REMATCH[1]}")
            [[ $path == "$NEWDIR"/lib/* ]] || { warn "$(basename "$f") loads a host library: $line"; bad=1; }
        done < <(LD_LIBRARY_PATH=/lib/$MULTIARCH:/usr/lib/$MULTIARCH LD_TRACE_LOADED_OBJECTS=1 \
                 "$NEWDIR/lib/$LOADER" "$f" 2>&1)
    done
    return $bad
}

install_bundle() {   # move $NEWDIR into place with renames only
    local old=
    if [[ -e $OUTDIR ]]; then
        old=$(mktemp -d "$OUTDIR.old.XXXXXX")
        mv -T "$OUTDIR" "$old/b"
    fi
    mv -T "$NEWDIR" "$OUTDIR"
    NEWDIR=
    [[ -z $old ]] || rm -rf "$old"
}

# ----------------------------------------------------------------------- main
log "building into $OUTDIR (suites: ${SUITES[*]}; cache: $CACHE)"
for suite in "${SUITES[@]}"; do
    NEWDIR=$(mktemp -d "$OUTDIR.new.XXXXXX")
    chmod 755 "$NEWDIR"
    if ! build_suite "$suite"; then
        warn "skipping $suite"
        rm -rf "$NEWDIR"; NEWDIR=
        continue
    fi
    if ! check_isolation; then
        warn "$suite: bundle is not self-contained; skipping it"
        rm -rf "$NEWDIR"; NEWDIR=
        continue
    fi
    log "$suite: running criu check"
    if bundle_check "$NEWDIR" "$STAGE/check.log"; then
        grep -v 'RLIMIT_NOFILE' "$STAGE/check.log" | sed 's/^/    /' || true
        install_bundle
        log "installed $(cat "$OUTDIR/VERSION") in $OUTDIR ($(du -sh "$OUTDIR" | cut -f1), $((SECONDS - START)) s)"
        exit 0
    fi
    warn "$suite: 'criu check' failed with this bundle:"
    sed 's/^/    /' "$STAGE/check.log" >&2
    rm -rf "$NEWDIR"; NEWDIR=
done
die "no suite gave a criu that passes 'criu check' on this machine (tried: ${SUITES[*]})"
