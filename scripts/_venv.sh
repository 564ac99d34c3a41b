# shellcheck shell=bash
# Sourced (from the repo root) by scripts/test.sh and scripts/demo.sh:
# creates .venv with python3 when it is missing or broken, installs the project
# editable with its extras test, gui and postgresql, and puts .venv/bin first on PATH.
#
# The install is skipped when .venv already holds it for the current
# pyproject.toml; JOBCONTROL_REINSTALL=1 forces it. PYTHON picks the interpreter
# that creates the venv (default: python3).

_jc_python="${PYTHON:-python3}"

if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -c 'import sys' >/dev/null 2>&1; then
    echo "==> creating .venv with $("$_jc_python" --version 2>&1)"
    if ! "$_jc_python" -m venv --clear .venv; then
        echo "FAILED: creating .venv with $_jc_python" >&2
        exit 1
    fi
fi

_jc_stamp=".venv/.jobcontrol-install"
_jc_want="$(sha256sum pyproject.toml | cut -d' ' -f1) [test,gui,postgresql]"
if [[ "${JOBCONTROL_REINSTALL:-0}" != 0 ]] \
    || [[ "$(cat "$_jc_stamp" 2>/dev/null)" != "$_jc_want" ]] \
    || ! .venv/bin/python -c 'import importlib.metadata as m; m.version("jobcontrol")' >/dev/null 2>&1; then
    echo "==> installing jobcontrol (editable) with extras test,gui,postgresql into .venv"
    rm -f "$_jc_stamp"
    _jc_log="$(mktemp)"
    # Quiet on success (pip -q still relays the build backend's warnings); the
    # whole log on failure.
    if ! .venv/bin/python -m pip install --quiet --disable-pip-version-check \
        -e '.[test,gui,postgresql]' >"$_jc_log" 2>&1; then
        cat "$_jc_log" >&2
        rm -f "$_jc_log"
        echo "FAILED: pip install -e '.[test,gui,postgresql]' (see the errors above)" >&2
        exit 1
    fi
    rm -f "$_jc_log"
    printf '%s\n' "$_jc_want" >"$_jc_stamp"
fi

VIRTUAL_ENV="$PWD/.venv"
PATH="$VIRTUAL_ENV/bin:$PATH"
export VIRTUAL_ENV PATH
unset PYTHONHOME
unset _jc_python _jc_stamp _jc_want _jc_log
