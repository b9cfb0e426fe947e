#!/usr/bin/env bash
# Writes what the fusebox-tls and fusebox-tokens Secrets hold, for a first deployment or a test
# cluster: a CA (ca.crt; its key ca.key stays with you), a certificate for the proxy and the
# replicas signed by it (tls.crt, tls.key: the names `fusebox`, the pods under the headless
# Service `fusebox-pods` in NAMESPACE, localhost), and a token file with one random token per
# tenant named (tokens). An overlay's secretGenerator reads them from its secrets/ folder.
#   deploy/k8s/make-secrets.sh deploy/k8s/overlays/gpu/secrets fusebox alice bob
# Use your own CA in production; rotate by replacing the files and re-applying (the server and
# the proxy read the new pair without a restart, the server every --tls_reload_s).
set -euo pipefail
out=${1:?usage: make-secrets.sh DIR [NAMESPACE [TENANT...]]}
ns=${2:-fusebox}
shift $(($# < 2 ? $# : 2))
tenants=("${@:-default}")
mkdir -p "$out"
umask 077
if [ ! -f "$out/ca.key" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 365 \
    -subj /CN=fusebox-ca -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
fi
san="DNS:fusebox,DNS:fusebox.$ns,DNS:fusebox.$ns.svc,DNS:fusebox.$ns.svc.cluster.local"
san+=",DNS:fusebox-pods,DNS:*.fusebox-pods,DNS:*.fusebox-pods.$ns.svc"
san+=",DNS:*.fusebox-pods.$ns.svc.cluster.local,DNS:localhost,IP:127.0.0.1"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 90 \
  -subj /CN=fusebox -CA "$out/ca.crt" -CAkey "$out/ca.key" \
  -addext "subjectAltName=$san" -addext "basicConstraints=critical,CA:FALSE" \
  -addext "extendedKeyUsage=serverAuth,clientAuth" \
  -keyout "$out/tls.key" -out "$out/tls.crt" 2>/dev/null
: > "$out/tokens"
for t in "${tenants[@]}"; do
  printf '%s %s\n' "$(openssl rand -hex 24)" "$t" >> "$out/tokens"
done
echo "wrote $out/{ca.crt,tls.crt,tls.key,tokens} (keep $out/ca.key elsewhere)"
