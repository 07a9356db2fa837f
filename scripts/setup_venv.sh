#!/usr/bin/env bash
# Create .venv in the repository root if it is missing and install rlflow into it.
# Idempotent: a second run reinstalls only when setup.py or pyproject.toml changed.
# torch is installed first and pinned, because a plain "torch" requirement pulls a
# multi-GB CUDA build; TORCH_SPEC overrides the pin (e.g. for a GPU machine).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.rlflow-installed"
WANT="$(cat "$ROOT/setup.py" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1) $TORCH_SPEC"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "setup: installing $TORCH_SPEC and rlflow (a minute or two on a fresh machine)" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$TORCH_SPEC" 2>&1 \
        | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[dev]" 2>&1 \
        | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
    "$VENV/bin/python" -c "import rlflow, torch, torch_geometric, onnxruntime, gymnasium, ray" \
        || { echo "setup: the install failed (see above)" >&2; exit 1; }
    echo "$WANT" > "$STAMP"
fi
