"""``jobcontrol completion bash|zsh``: shell completion scripts made from the CLI's own parser.

The script carries a table of every command path (``jobcontrol daemon start``) with
its subcommands and options, so it completes without starting Python at each Tab:
subcommands, then options after ``-``, file names where a file or directory is
wanted (``--db``, ``--state-dir``, ``load FILE``...), and nothing for other values.
"""

from __future__ import annotations

import argparse
import shlex

# Values that name a file or a directory (by the option's or argument's dest).
FILE_DESTS = frozenset({"db", "state_dir", "log_root", "output", "tls_cert", "tls_key", "dir"})
FILE_ARGS = frozenset({"file"})


class _Table:
    """What the script needs to know about each command path."""

    def __init__(self) -> None:
        self.opts: dict[str, list[str]] = {}
        self.subs: dict[str, list[str]] = {}
        self.args: dict[str, list[str]] = {}  # a positional's choices
        self.file_args: set[str] = set()
        self.values: set[str] = set()  # options followed by a value
        self.files: set[str] = set()  # options followed by a file name

    def walk(self, parser: argparse.ArgumentParser, path: str) -> None:
        opts: list[str] = []
        subs: list[str] = []
        choices: list[str] = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    subs.append(name)
                    self.walk(child, f"{path} {name}")
            elif action.option_strings:
                opts += action.option_strings
                if action.nargs != 0:
                    self.values.update(action.option_strings)
                    if action.dest in FILE_DESTS:
                        self.files.update(action.option_strings)
            elif action.dest in FILE_ARGS:
                self.file_args.add(path)
            elif action.choices:
                choices += [str(c) for c in action.choices]
        self.opts[path] = opts
        if subs:
            self.subs[path] = subs
        if choices:
            self.args[path] = choices


def _assoc(entries: dict[str, list[str]], shell: str) -> str:
    """The body of an associative array: ``[key]=value`` for bash (4.0 on), ``key value``
    for zsh."""
    lines = []
    for key, words in sorted(entries.items()):
        key_, value = shlex.quote(key), shlex.quote(" ".join(words))
        lines.append(f"    [{key_}]={value}" if shell == "bash" else f"    {key_} {value}")
    return "\n".join(lines)


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    table = _Table()
    prog = parser.prog
    table.walk(parser, prog)
    data = dict(
        prog=prog,
        fn=f"_{prog}",
        opts=_assoc(table.opts, shell),
        subs=_assoc(table.subs, shell),
        args=_assoc(table.args, shell),
        file_args=_assoc({key: ["1"] for key in table.file_args}, shell),
        values=shlex.quote(" ".join(sorted(table.values))),
        files=shlex.quote(" ".join(sorted(table.files))),
    )
    template = _BASH if shell == "bash" else _ZSH
    return template.format(**data)


_BASH = """\
# bash completion for {prog}, made by `{prog} completion bash`. Use it with
#   eval "$({prog} completion bash)"           (in ~/.bashrc), or
#   {prog} completion bash > ~/.local/share/bash-completion/completions/{prog}
declare -gA {fn}_opts=(
{opts}
)
declare -gA {fn}_subs=(
{subs}
)
declare -gA {fn}_args=(
{args}
)
declare -gA {fn}_file_args=(
{file_args}
)
{fn}_values={values}
{fn}_files={files}

{fn}() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local cmdpath={prog} word i
    COMPREPLY=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${{COMP_WORDS[i]}}
        if [[ " ${fn}_values " == *" $word "* ]]; then
            ((i++))
            continue
        fi
        [[ -n ${{{fn}_opts["$cmdpath $word"]+x}} ]] && cmdpath="$cmdpath $word"
    done
    if [[ " ${fn}_files " == *" $prev "* ]]; then
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        return
    fi
    [[ " ${fn}_values " == *" $prev "* ]] && return
    local words
    if [[ $cur == -* ]]; then
        words=${{{fn}_opts[$cmdpath]}}
    elif [[ -n ${{{fn}_subs[$cmdpath]+x}} ]]; then
        words=${{{fn}_subs[$cmdpath]}}
    elif [[ -n ${{{fn}_file_args[$cmdpath]+x}} ]]; then
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        return
    else
        words=${{{fn}_args[$cmdpath]}}
    fi
    mapfile -t COMPREPLY < <(compgen -W "$words" -- "$cur")
}}
complete -F {fn} {prog}
"""

_ZSH = """\
#compdef {prog}
# zsh completion for {prog}, made by `{prog} completion zsh`. Use it with
#   {prog} completion zsh > "${{fpath[1]}}/_{prog}"   (then start a new shell), or
#   source <({prog} completion zsh)                  (in ~/.zshrc, after compinit)
typeset -gA {fn}_opts {fn}_subs {fn}_args {fn}_file_args
{fn}_opts=(
{opts}
)
{fn}_subs=(
{subs}
)
{fn}_args=(
{args}
)
{fn}_file_args=(
{file_args}
)
typeset -g {fn}_values={values}
typeset -g {fn}_files={files}

{fn}() {{
    local cur=${{words[CURRENT]}} prev=${{words[CURRENT-1]}}
    local cmdpath={prog} word i
    for (( i = 2; i < CURRENT; i++ )); do
        word=${{words[i]}}
        if [[ " ${fn}_values " == *" $word "* ]]; then
            (( i++ ))
            continue
        fi
        (( ${{+{fn}_opts[$cmdpath $word]}} )) && cmdpath="$cmdpath $word"
    done
    if [[ " ${fn}_files " == *" $prev "* ]]; then
        _files
        return
    fi
    [[ " ${fn}_values " == *" $prev "* ]] && return 1
    if [[ $cur == -* ]]; then
        compadd -- ${{(s: :){fn}_opts[$cmdpath]}}
    elif (( ${{+{fn}_subs[$cmdpath]}} )); then
        compadd -- ${{(s: :){fn}_subs[$cmdpath]}}
    elif (( ${{+{fn}_file_args[$cmdpath]}} )); then
        _files
    else
        compadd -- ${{(s: :){fn}_args[$cmdpath]}}
    fi
}}

if [[ ${{zsh_eval_context[-1]}} == loadautofunc ]]; then
    {fn} "$@"
else
    compdef {fn} {prog}
fi
"""
