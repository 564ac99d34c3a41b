"""The engine's signals keep blinker's contract while they remember each sender's
receivers: a receiver connected or disconnected later is heard or not heard at once,
weakly held receivers still go when their owner goes, and a new sender at a dead
sender's address does not get its receivers."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from jobcontrol.events import _Signal


class Sender:
    pass


def test_a_receiver_connected_after_sends_is_heard_and_one_disconnected_is_not() -> None:
    sig = _Signal("t")
    sender = Sender()
    heard: list[tuple[str, Any]] = []

    def first(s: object, **kw: Any) -> str:
        heard.append(("first", kw["n"]))
        return "one"

    def second(s: object, **kw: Any) -> None:
        heard.append(("second", kw["n"]))

    sig.connect(first, sender=sender, weak=False)
    assert sig.send(sender, n=1) == [(first, "one")]
    assert sig.send(sender, n=2) == [(first, "one")]  # from what it remembered
    sig.connect(second, sender=sender, weak=False)
    sig.send(sender, n=3)
    sig.disconnect(first)
    sig.send(sender, n=4)
    assert heard == [("first", 1), ("first", 2), ("first", 3), ("second", 3), ("second", 4)]


def test_receivers_of_one_sender_are_not_sent_another_senders_signal() -> None:
    sig = _Signal("t")
    a, b = Sender(), Sender()
    heard: list[object] = []
    sig.connect(lambda s, **kw: heard.append(("a", s)), sender=a, weak=False)
    sig.connect(lambda s, **kw: heard.append(("any", s)), weak=False)
    sig.send(a)
    sig.send(b)
    sig.send(a)
    assert len(heard) == 5  # (the order of a sender's receivers is not part of the contract)
    assert [h for h in heard if h[0] == "a"] == [("a", a), ("a", a)]
    assert [h for h in heard if h[1] is b] == [("any", b)]


def test_a_new_sender_at_a_dead_senders_address_does_not_get_its_receivers() -> None:
    sig = _Signal("t")
    heard: list[str] = []
    old = Sender()
    sig.connect(lambda s, **kw: heard.append("old's"), sender=old, weak=False)
    sig.send(old)
    address = id(old)
    del old
    gc.collect()
    # Senders made (and kept) until one is given the dead one's address: the allocator
    # hands freed blocks out again, so one of the first few takes it.
    made = []
    for _ in range(100_000):
        made.append(Sender())
        if id(made[-1]) == address:
            break
    else:
        pytest.fail("no new sender was given the dead one's address")
    new = made[-1]
    heard.clear()
    sig.send(new)
    assert heard == []


def test_a_weakly_held_receiver_goes_with_its_owner() -> None:
    sig = _Signal("t")
    sender = Sender()
    heard: list[str] = []

    class Owner:
        def on(self, s: object, **kw: Any) -> None:
            heard.append("owner")

    owner = Owner()
    sig.connect(owner.on, sender=sender)  # weak (blinker's default)
    sig.send(sender)
    del owner
    gc.collect()
    sig.send(sender)
    assert heard == ["owner"]


def test_a_muted_signal_calls_nobody_and_a_coroutine_receiver_is_still_refused() -> None:
    sig = _Signal("t")
    sender = Sender()
    heard: list[str] = []
    sig.connect(lambda s, **kw: heard.append("x"), sender=sender, weak=False)
    sig.send(sender)
    with sig.muted():
        assert sig.send(sender) == []
    assert heard == ["x"]

    async def coro(s: object, **kw: Any) -> None:
        pass

    sig.connect(coro, sender=sender, weak=False)
    with pytest.raises(RuntimeError, match="coroutine"):
        sig.send(sender)
