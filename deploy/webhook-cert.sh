#!/usr/bin/env bash
# webhook-cert.sh - the webhook's TLS certificate, and a kustomize overlay that
# deploys gpusnap with it: the Secret the webhook reads and the
# MutatingWebhookConfiguration's caBundle. See --help.
set -euo pipefail

PROG=webhook-cert
DEPLOY_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAMESPACE=gpusnap-system
SERVICE=gpusnap-webhook
SECRET=gpusnap-webhook-tls
DAYS=365
RENEW_DAYS=30
OUT=$DEPLOY_DIR/.overlay
APPLY=0
FORCE=0

log() { printf '[%s] %s\n' "$PROG" "$*"; }
die() { printf '[%s] error: %s\n' "$PROG" "$*" >&2; exit 1; }

usage() {
    cat <<EOF
Usage: $0 [options]

Writes into OUT (default $OUT):
  ca.crt, ca.key          a CA made for this webhook (kept: renewals reuse it,
                          so caBundle stays valid while certificates rotate)
  tls.crt, tls.key        the server certificate for $SERVICE.$NAMESPACE.svc,
                          signed by that CA, valid $DAYS days
  secret.yaml             the Secret $SECRET (kubernetes.io/tls)
  kustomization.yaml      an overlay: $DEPLOY_DIR in NAMESPACE, the Secret, caBundle
Then 'kubectl apply -k OUT' deploys gpusnap. The server certificate is kept
while it has more than $RENEW_DAYS days left (and made again otherwise); the
webhook picks a renewed one up without a restart once the Secret is updated.

Options:
  --out DIR           where to write (default $OUT)
  --namespace NS      the webhook's namespace (default $NAMESPACE)
  --days N            validity of a new server certificate (default $DAYS)
  --force             make a new server certificate even if the old is good
  --apply             also run 'kubectl apply -k OUT'
  -h, --help          this help
EOF
}

while (($#)); do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --out) OUT=${2:?--out needs a directory}; shift ;;
        --namespace) NAMESPACE=${2:?--namespace needs a name}; shift ;;
        --days) DAYS=${2:?--days needs a number}; shift ;;
        --force) FORCE=1 ;;
        --apply) APPLY=1 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done
[[ $DAYS =~ ^[1-9][0-9]*$ ]] || die "--days must be a positive number"
[[ $NAMESPACE =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "--namespace must be a DNS label"
command -v openssl >/dev/null || die "missing openssl (Debian package openssl)"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
umask 077

HOST=$SERVICE.$NAMESPACE.svc
if [[ ! -s $OUT/ca.key || ! -s $OUT/ca.crt ]]; then
    log "making a CA in $OUT"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
        -subj "/CN=gpusnap-webhook-ca" -keyout "$OUT/ca.key.new" -out "$OUT/ca.crt.new" 2>/dev/null
    mv "$OUT/ca.key.new" "$OUT/ca.key"
    mv "$OUT/ca.crt.new" "$OUT/ca.crt"
    FORCE=1
fi

cert_good() {
    [[ -s $OUT/tls.crt && -s $OUT/tls.key ]] &&
        openssl x509 -in "$OUT/tls.crt" -noout -checkend $((RENEW_DAYS * 86400)) >/dev/null &&
        openssl x509 -in "$OUT/tls.crt" -noout -ext subjectAltName 2>/dev/null | tr -d ' ' | tr ',' '\n' |
            grep -qxF "DNS:$HOST" &&
        openssl verify -CAfile "$OUT/ca.crt" "$OUT/tls.crt" >/dev/null 2>&1
}

if ((FORCE)) || ! cert_good; then
    log "making the server certificate for $HOST ($DAYS days)"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    printf 'subjectAltName=DNS:%s,DNS:%s,DNS:%s.cluster.local\nextendedKeyUsage=serverAuth\n' \
        "$HOST" "$SERVICE.$NAMESPACE" "$HOST" >"$tmp/ext"
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$HOST" \
        -keyout "$tmp/tls.key" -out "$tmp/tls.csr" 2>/dev/null
    openssl x509 -req -in "$tmp/tls.csr" -CA "$OUT/ca.crt" -CAkey "$OUT/ca.key" -CAcreateserial \
        -CAserial "$OUT/ca.srl" -days "$DAYS" -extfile "$tmp/ext" -out "$tmp/tls.crt" 2>/dev/null
    mv "$tmp/tls.key" "$OUT/tls.key"
    mv "$tmp/tls.crt" "$OUT/tls.crt"
else
    log "server certificate in $OUT still good"
fi

b64() { base64 -w0 <"$1"; }
cat >"$OUT/secret.yaml" <<EOF
# written by deploy/webhook-cert.sh
apiVersion: v1
kind: Secret
metadata:
  name: $SECRET
  namespace: $NAMESPACE
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$OUT/tls.crt")
  tls.key: $(b64 "$OUT/tls.key")
EOF
cat >"$OUT/kustomization.yaml" <<EOF
# written by deploy/webhook-cert.sh: gpusnap with this webhook certificate
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: $NAMESPACE
resources:
  - $(realpath --relative-to="$OUT" "$DEPLOY_DIR")
  - secret.yaml
patches:
  - target:
      group: admissionregistration.k8s.io
      kind: MutatingWebhookConfiguration
      name: gpusnap
    patch: |-
      - op: add
        path: /webhooks/0/clientConfig/caBundle
        value: $(b64 "$OUT/ca.crt")
      - op: replace
        path: /webhooks/0/clientConfig/service/namespace
        value: $NAMESPACE
      - op: replace
        path: /webhooks/0/namespaceSelector/matchExpressions/0/values
        value: [$NAMESPACE, kube-system]
  - target:
      kind: ClusterRoleBinding
      name: gpusnap-agent
    patch: |-
      - op: replace
        path: /subjects/0/namespace
        value: $NAMESPACE
EOF
log "wrote $OUT/kustomization.yaml (deploy with: kubectl apply -k $OUT)"
if ((APPLY)); then
    kubectl apply -k "$OUT"
fi
