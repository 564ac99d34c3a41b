"""The Qt binding itself: PySide6-Essentials 6.12.0 loses a reference to ``True`` on
every ``Signal.emit``, which aborts the interpreter ("bool_dealloc") after a few
thousand signals; the admin client emits thousands a minute. pyproject.toml
keeps that release out; this fails if a binding with the bug comes back."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal


class _Emitter(QObject):
    fired = Signal(int, str)


def test_emitting_a_signal_keeps_the_reference_counts_of_true_and_false() -> None:
    emitter = _Emitter()
    seen: list[int] = []
    emitter.fired.connect(lambda n, _text: seen.append(n))
    before = sys.getrefcount(True), sys.getrefcount(False)
    for n in range(2000):
        emitter.fired.emit(n, "x")
    after = sys.getrefcount(True), sys.getrefcount(False)
    assert len(seen) == 2000
    # A few references may come and go elsewhere; a leak per emit would be ~2000.
    assert abs(after[0] - before[0]) < 50, (before, after)
    assert abs(after[1] - before[1]) < 50, (before, after)
