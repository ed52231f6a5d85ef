#!/bin/sh
# A workload whose first start is slow and whose later starts need not be, for
# the rootfs capture path (docs/CAPTURE-PATHS.md): a busybox sh script run as
# a container's one child tree (`sh -c '/app/run.sh & wait'`).
#
#   fetch    /var/lib/app/source.txt (its root filesystem), from $SOURCE_URL
#            with busybox wget; skipped when it is there
#   compile  /cache/compiled.bin (a cache volume) and /var/lib/app/compiled.bin
#            (its root filesystem) from the source, "compiling" for
#            $COMPILE_SECONDS (default 3); deletes /etc/app-stale.conf, which
#            the image ships; skipped when /cache/compiled.bin was compiled
#            from this source
#
# then says "ready" and sleeps on. Every line goes to $APP_LOG (default
# /out/log), each step's with the seconds it took (from /proc/uptime), and
# "FAIL: ..." where a step could not be done.
log=${APP_LOG:-/out/log}
exec >>"$log" 2>&1
now() { read -r up _ </proc/uptime; echo "$up"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
fail() { echo "FAIL: $*"; exit 1; }

start=$(now)
echo "start at $start (pid $$, cwd $(pwd), mode ${APP_MODE:-unset})"
mkdir -p /var/lib/app || fail "mkdir /var/lib/app"

t=$(now)
if [ -s /var/lib/app/source.txt ]; then
  echo "fetch: skipped (/var/lib/app/source.txt is there)"
else
  [ -n "${SOURCE_URL:-}" ] || fail "fetch: no SOURCE_URL"
  wget -q -O /var/lib/app/source.part "$SOURCE_URL" || fail "fetch: wget $SOURCE_URL"
  mv /var/lib/app/source.part /var/lib/app/source.txt
  echo "fetch: $(wc -c </var/lib/app/source.txt) bytes in $(since "$t") s"
fi

digest=$(sha256sum /var/lib/app/source.txt | awk '{ print $1 }')
t=$(now)
if [ -f /cache/compiled.bin ] && [ "$(head -n 1 /cache/compiled.bin)" = "compiled from $digest" ]; then
  echo "compile: skipped (/cache/compiled.bin is there)"
else
  sleep "${COMPILE_SECONDS:-3}"
  { echo "compiled from $digest"; awk '{ print NR ": " $0 }' /var/lib/app/source.txt; } >/cache/compiled.part ||
    fail "compile: writing /cache"
  cp /cache/compiled.part /var/lib/app/compiled.bin || fail "compile: writing /var/lib/app"
  mv /cache/compiled.part /cache/compiled.bin
  rm -f /etc/app-stale.conf || fail "compile: rm /etc/app-stale.conf"
  echo "compile: $(since "$t") s"
fi
[ -e /etc/app-stale.conf ] && echo "stale: /etc/app-stale.conf present" || echo "stale: /etc/app-stale.conf absent"
echo "ready in $(since "$start") s"
while :; do sleep 1; done
