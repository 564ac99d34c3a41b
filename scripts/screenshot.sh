#!/usr/bin/env bash
# A screenshot of the admin window with the sample trees running:
#   bash scripts/screenshot.sh [OUT.png [workers]]   (relative to the repository; default
#   docs/admin-window.png; with "workers", the Workers & Lanes panel: scripts/workers_screenshot.py)
#
# Runs a throw-away daemon on testsetup/demo.yaml (database, state, HOME and
# XDG dirs in a temp dir, its API on a free port), opens the admin client on it
# under Xvfb (scripts/screenshot.py waits until a job runs, selects it, expands
# the tree) and saves the window. The daemon is stopped and the temp dir removed
# on the way out, also on failure.
#
# Needs xvfb-run and the X libraries of Qt's xcb platform plugin; as root on
# Debian/Ubuntu it installs the missing ones with apt-get, otherwise it says
# which to install.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-docs/admin-window.png}"

# xvfb-run + xauth, and what PySide6's libqxcb.so (and Qt's GUI libraries) load
# beyond a minimal Debian: found with ldd on the plugin and QT_DEBUG_PLUGINS=1.
packages=(
    xvfb xauth
    libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0
    libxcb-shape0 libxcb-randr0 libxcb-xfixes0 libxcb-sync1 libxcb-shm0 libxcb-xkb1
    libx11-xcb1 libxkbcommon-x11-0 libegl1 libgl1 libfontconfig1 fonts-dejavu-core
)
if command -v dpkg-query >/dev/null; then
    missing=()
    for pkg in "${packages[@]}"; do
        if [[ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null)" != installed ]]; then
            missing+=("$pkg")
        fi
    done
    if ((${#missing[@]})); then
        if [[ "$(id -u)" != 0 ]]; then
            echo "FAILED: missing packages; as root: apt-get install -y ${missing[*]}" >&2
            exit 1
        fi
        echo "==> installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
            apt-get update -q >/dev/null
            apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
        fi
    fi
fi
if ! command -v xvfb-run >/dev/null; then
    echo "FAILED: xvfb-run not found (Debian: apt-get install xvfb xauth)" >&2
    exit 1
fi

# shellcheck source=scripts/_venv.sh
source scripts/_venv.sh

tmp="$(mktemp -d -t jc-screenshot-XXXXXX)"
jc() { jobcontrol --db "$tmp/jc.db" --state-dir "$tmp/state" "$@"; }
cleanup() {
    local status=$?
    trap - EXIT INT TERM
    if jc daemon status >/dev/null 2>&1; then
        jc daemon stop --kill >/dev/null || echo "screenshot.sh: could not stop the daemon" >&2
    fi
    rm -rf "$tmp"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The daemon writes its admin token under $XDG_CONFIG_HOME/jobcontrol/: keep it,
# and everything else the daemon and Qt write (the window's settings too), in the temp dir.
export HOME="$tmp/home" XDG_STATE_HOME="$tmp/xdg-state" XDG_CONFIG_HOME="$tmp/xdg-config"
export XDG_CACHE_HOME="$tmp/xdg-cache" XDG_RUNTIME_DIR="$tmp/xdg-runtime"
mkdir -p "$HOME" "$XDG_STATE_HOME" "$XDG_CONFIG_HOME" "$XDG_CACHE_HOME"
mkdir -m 700 "$XDG_RUNTIME_DIR"
unset JOBCONTROL_URL JOBCONTROL_TOKEN JOBCONTROL_DB
export LANG=C.UTF-8

jc db upgrade >/dev/null
jc load testsetup/demo.yaml
# Started from the temp dir: its tasks run there (foo's `ls -l` lists it).
(cd "$tmp" && jc daemon start --port 0)
url="$(jc daemon status | sed -n 's|^admin API: \(.*\)/api/v1$|\1|p')"
if [[ -z "$url" ]]; then
    echo "FAILED: no admin API URL in 'jobcontrol daemon status'" >&2
    exit 1
fi

# The first start wrote the admin token to this database's own token file.
token_file="$(python -c 'import sys
from jobcontrol.client.locate import token_path
print(token_path(sys.argv[1]))' "$tmp/jc.db")"

mkdir -p "$(dirname "$out")"
# The window keeps the size it opens with (what a new user sees).
script=scripts/screenshot.py
[[ "${2:-}" == workers ]] && script=scripts/workers_screenshot.py
xvfb-run -a -s "-screen 0 1400x800x24" \
    python "$script" --url "$url" --token-file "$token_file" --out "$out"
