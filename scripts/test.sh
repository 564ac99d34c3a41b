#!/usr/bin/env bash
# The project's test command: bash scripts/test.sh [pytest args...]
# Sets up .venv, then runs, stopping at the first failure:
# ruff check, ruff format --check, mypy, lint-imports, pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/_venv.sh
source scripts/_venv.sh

export QT_QPA_PLATFORM=offscreen

step() {
    local name="$1"
    shift
    echo "==> $name"
    if ! "$@"; then
        echo "FAILED: $name" >&2
        exit 1
    fi
}

step "ruff check" ruff check .
step "ruff format --check" ruff format --check .
step "mypy" mypy
step "lint-imports" lint-imports

echo "==> pytest"
rc=0
python -m pytest "$@" || rc=$?
case "$rc" in
    0) echo "==> all checks passed" ;;
    5)
        echo "FAILED: pytest collected no tests (exit code 5)" >&2
        exit 1
        ;;
    *)
        echo "FAILED: pytest (exit code $rc)" >&2
        exit "$rc"
        ;;
esac
