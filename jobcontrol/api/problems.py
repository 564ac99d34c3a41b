"""Pydantic's validation errors as a client reads them: no union labels in a place,
one problem per place, and no internals in the words."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

# The label pydantic puts in an error's place for each member of a union it tried
# (``int``, ``constrained-str``, ``function-after[_no_nul(), constrained-str]``): the
# name of a validator, not of anything in the request.
_UNION_LABEL = re.compile(r"(constrained-)?(int|float|str|bool|bytes|none)|[a-z-]+\[.*\]")
_SHOULD_BE = "Input should be "
# The only reason a str fails pydantic's str check: it cannot become UTF-8.
_NOT_TEXT = (
    "Input should be a valid string, unable to parse raw data as a unicode string",
    "must be text: a lone UTF-16 surrogate (\\u escape) is not a character",
)


def _place(loc: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(p for p in loc if not (isinstance(p, str) and _UNION_LABEL.fullmatch(p)))


def readable_errors(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``errors`` with each union's labels taken out of its place, and the errors of one
    place (each member of a union that refused the value) merged into one: "Input should
    be a valid integer or a valid string"."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for err in errors:
        place = _place(err.get("loc", ()))
        msg = str(err.get("msg", ""))
        msg = _NOT_TEXT[1] if msg == _NOT_TEXT[0] else msg
        first = merged.get(place)
        if first is None or err.get("type") == "json_invalid":
            merged[place] = {**err, "loc": place, "msg": msg}
            continue
        if msg in first["msg"].split(" or "):
            continue
        if first["msg"].startswith(_SHOULD_BE) and msg.startswith(_SHOULD_BE):
            msg = msg.removeprefix(_SHOULD_BE)
        first["msg"] = f"{first['msg']} or {msg}"
    return list(merged.values())
