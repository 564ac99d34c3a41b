#!/usr/bin/env bash
# The project's run command: bash scripts/demo.sh [demo args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/_venv.sh
source scripts/_venv.sh
exec .venv/bin/jobcontrol demo "$@"
