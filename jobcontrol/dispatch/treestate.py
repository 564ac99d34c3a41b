"""The job-tree-state protocol (spec 5): edits and dispatcher reactions strictly in turn.

An edit waits for ``IDLE`` and takes ``USER_START``, commits one transaction,
then hands its change set over and sets ``USER_END``. The dispatcher takes
``USER_END -> DISPATCHER``, reacts once to the whole change set, and returns to
``IDLE``. Every wait is bounded and every state is restored in ``finally``;
``notify_all`` wakes every waiter (the Inq source's single ``notify`` could
wake the wrong one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from jobcontrol.errors import BusyError
from jobcontrol.model import TreeState

log = logging.getLogger(__name__)


class TreeStateProtocol:
    def __init__(self, edit_timeout: float = 30.0) -> None:
        self._cond = threading.Condition()
        self._state = TreeState.STARTUP
        self._pending: Any = None
        self._edit_waiters = 0
        self.edit_timeout = edit_timeout
        self.waits = 0  # edits that had to wait (jobcontrol_tree_state_waits_total)

    @property
    def state(self) -> TreeState:
        with self._cond:
            return self._state

    def _wait_for(self, predicate: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._cond.wait(remaining)
        return True

    def _set(self, state: TreeState) -> None:
        self._state = state
        self._cond.notify_all()

    def startup_done(self) -> None:
        with self._cond:
            self._set(TreeState.IDLE)

    def begin_startup(self) -> None:
        with self._cond:
            if self._state is not TreeState.STARTUP:
                raise BusyError(f"illegal tree state {self._state} wanted {TreeState.STARTUP}")
            self._set(TreeState.DISPATCHER)

    @contextmanager
    def user_edit(self, timeout: float | None = None) -> Iterator[EditTicket]:
        """Hold ``USER_START`` for one edit transaction.

        The body sets ``ticket.change`` to what it committed; with a change the
        state goes to ``USER_END`` for the dispatcher, without one (nothing
        changed, or an error) straight back to ``IDLE``.
        """
        timeout = self.edit_timeout if timeout is None else timeout
        with self._cond:
            self._edit_waiters += 1
            try:
                if self._state is not TreeState.IDLE:
                    self.waits += 1
                ok = self._wait_for(lambda: self._state is TreeState.IDLE, timeout)
            finally:
                self._edit_waiters -= 1
            if not ok:
                raise BusyError(
                    f"the job tree is busy ({self._state}); gave up after {timeout:g}s, try again"
                )
            self._set(TreeState.USER_START)
        ticket = EditTicket()
        try:
            yield ticket
        except BaseException:
            with self._cond:
                self._set(TreeState.IDLE)
            raise
        with self._cond:
            if ticket.change is None:
                self._set(TreeState.IDLE)
            else:
                self._pending = ticket.change
                self._set(TreeState.USER_END)

    @contextmanager
    def dispatcher_section(self) -> Iterator[Any]:
        """Take the tree for one dispatcher handler; yields a pending edit to react to, or None.

        Edits waiting for ``IDLE`` go first (bounded), so a busy dispatcher
        cannot starve them.
        """
        with self._cond:
            self._wait_for(
                lambda: self._edit_waiters == 0 or self._state is not TreeState.IDLE, 1.0
            )
            while not self._wait_for(
                lambda: self._state in (TreeState.IDLE, TreeState.USER_END), 60.0
            ):
                log.warning("dispatcher still waiting for the job tree (state %s)", self._state)
            pending, self._pending = self._pending, None
            if self._state is TreeState.USER_END and pending is None:
                log.error("tree state USER_END without a change set")
            self._set(TreeState.DISPATCHER)
        try:
            yield pending
        finally:
            with self._cond:
                self._set(TreeState.IDLE)

    def stop(self) -> None:
        with self._cond:
            self._set(TreeState.STARTUP)


class EditTicket:
    __slots__ = ("change",)

    def __init__(self) -> None:
        self.change: Any = None
