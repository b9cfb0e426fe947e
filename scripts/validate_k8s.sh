#!/usr/bin/env bash
# Validates deploy/k8s manifests against the Kubernetes API schemas with
# kubernetes-validate (PyPI; bundled schemas, works offline once installed).
# Installs it on first use into $FUSEBOX_TOOLS (default /tmp/fusebox-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${FUSEBOX_TOOLS:-/tmp/fusebox-tools}
pkg=kubernetes-validate==1.37.0
if ! PYTHONPATH=$dir python3 -c "import kubernetes_validate" 2>/dev/null; then
  python3 -m pip install -q --disable-pip-version-check --target "$dir" "$pkg" 2>/dev/null ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages --target "$dir" "$pkg"
fi
PYTHONPATH=$dir python3 -m kubernetes_validate --strict deploy/k8s/*.yaml
