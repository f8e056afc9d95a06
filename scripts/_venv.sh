# Sourced by scripts/test and scripts/run: make ./.venv with the project installed
# (editable, with test extras), reusing it when pyproject.toml has not changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EXTPROC_VENV:-$ROOT/.venv}"
STAMP="$VENV/.extproc-installed"
PY="${PYTHON:-python3}"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "==> preparing $VENV" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' >&2 || true
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" 2>&1 | grep -v '^WARNING: Location' >&2 || true
  # xds-protos ships an older copy of opentelemetry-proto's modules under the same
  # names, and whichever pip writes last wins: write opentelemetry-proto's own again.
  otlp="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
  "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "opentelemetry-proto==$otlp" \
    2>&1 | grep -v '^WARNING: Location' >&2 || true
  "$VENV/bin/python" -c "import extproc, envoy.service.ext_proc.v3, tokenizers, transformers, extproc.service.tracing" \
    || { echo "install failed" >&2; exit 1; }
  echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
