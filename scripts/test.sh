#!/usr/bin/env bash
# The README's test command: set up .venv if needed, then run the fast test suite.
# Extra arguments go to pytest (e.g. `./scripts/test.sh -m slow` for the slow tests).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_venv.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
