"""The dispatcher and its embedded worker, wired the one way the daemon runs them.

They share the store and nothing else: the dispatcher queues task runs, the
worker claims them and records their ends, each through the run queue, with
in-process wake-ups (``events``) so the path between tasks takes no poll.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from jobcontrol import cpupin, events, gcpause
from jobcontrol.cgroups import Containment, JoinWarmer
from jobcontrol.clock import Clock, TimerService
from jobcontrol.dispatch.dispatcher import Dispatcher, DispatcherConfig
from jobcontrol.filemodes import LogAccess
from jobcontrol.model import Kind, is_remote_worker
from jobcontrol.outage import OutageState
from jobcontrol.store import Store
from jobcontrol.store.relay import Relay
from jobcontrol.store.runqueue import RunQueue
from jobcontrol.taskenv import PassEnv
from jobcontrol.worker import Worker, keptends
from jobcontrol.worker import recovery as local_recovery

log = logging.getLogger(__name__)


class Runtime:
    def __init__(
        self,
        store: Store,
        config: DispatcherConfig,
        *,
        clock: Clock | None = None,
        timers: TimerService | None = None,
        version: str = "",
        pass_env: PassEnv | None = None,
        log_access: LogAccess | None = None,
        cgroups: str = "auto",
        task_open_files: int | None = None,
        log_store: str = "file",
        spool_dir: Path | None = None,
    ) -> None:
        """``pass_env``: the daemon's variables its tasks get (default: ``taskenv``'s list);
        ``log_access``: who may read task logs (default: the daemon's user alone);
        ``cgroups``: ``auto`` (a cgroup per task run where the machine allows) or ``off``;
        ``task_open_files``: the soft open-files limit tasks get (None: the daemon's);
        ``log_store``, ``spool_dir``: where task output goes (``Worker``)."""
        self.store = store
        self.config = config
        self.version = version
        self.pass_env = pass_env or PassEnv()
        self.log_access = log_access or LogAccess()
        self.cgroups = cgroups
        self.task_open_files = task_open_files
        self.log_store, self.spool_dir = log_store, spool_dir
        self.containment: Containment | None = None
        self.warmer: JoinWarmer | None = None  # keeps cgroup joins cheap around timers
        self.dispatcher = Dispatcher(store, config, clock=clock, timers=timers)
        self.worker: Worker | None = None
        # PostgreSQL: the wake-ups to and from workers in other processes (LISTEN/NOTIFY).
        self.relay: Relay | None = (
            None if store.is_sqlite else Relay(store, name="daemon", role="daemon")
        )
        # What the event stream last said of the database (``database.changed``).
        self._database_ok = True
        self._database_outages = 0  # outages of any part, overlapping ones counted once
        # When the daemon's outage (any part down) began: kept while parts come back one
        # by one, so its ``since`` does not move on when the first part down is back first.
        self._database_down_since: float | None = None
        self._database_lock = threading.Lock()
        self.dispatcher.outage.watch(self._outage_changed)
        if self.relay is not None:
            self.relay.outage.watch(self._outage_changed)

    def start(self) -> Dispatcher:
        """Recover, start the dispatcher, kill what lost runs left on this host, then
        start the embedded worker (none with 0 slots)."""
        d = self.dispatcher
        # SQLite: the WAL's checkpoints off the timers' and tasks' paths (store/checkpoint.py).
        self.store.checkpoint_in_background()
        if self.relay is not None:
            self.relay.start()  # before the dispatcher queues anything other workers must hear
        # Ends the worker of an earlier daemon kept on disk (stopped during an outage):
        # recorded before recovery, which would settle those runs as lost.
        keptends.record(RunQueue(self.store), self._spool_dir())
        # Runs of this host settled on an expired lease: what they left is killed here.
        events.runs_lost.connect(self._collect, sender=self.store, weak=False)
        d.start()
        if self.config.slots > 0:
            self.containment = Containment.setup(d.instance_id, self.cgroups)
            log.info("task runs are contained by %s", self.containment.describe())
            if self.containment.advice:
                log.warning("%s", self.containment.advice)
        self._warm_joins(d)
        # The host's half of recovery, before any work is taken (worker/recovery.py).
        local_recovery.kill_leftovers(
            d.instance_id,
            [r.id for r in d.recovery.lost if r.kind is Kind.TASK],
            d.recovery.kept,
            kill_grace=self.config.kill_grace,
            containment=self.containment,
        )
        # ...and what a `jobcontrol worker` of this host that recovery found gone left of
        # its lost runs (the host crashed with both: nothing else would ever kill it, and
        # a new run of the same tree would run beside it). By run id, so a live worker's
        # new tasks are never touched: as the lease rule's collection does while running.
        remote = [
            r.id
            for r in d.recovery.lost
            if r.kind is Kind.TASK and r.host == d.host and is_remote_worker(r.worker)
        ]
        if remote:
            local_recovery.collect(d.instance_id, remote, kill_grace=self.config.kill_grace)
        if self.config.slots > 0:
            self.worker = Worker(
                RunQueue(self.store),  # each run's lease is its lane's stale_timeout_s
                clock=d.clock,
                log_root=self.config.log_root,
                instance_id=d.instance_id,
                slots=self.config.slots,
                groups=self.config.slot_groups,
                default_max_log_files=self.config.default_max_log_files,
                kill_grace=self.config.kill_grace,
                version=self.version,
                pass_env=self.pass_env,
                log_access=self.log_access,
                containment=self.containment,
                task_open_files=self.task_open_files,
                log_store=self.log_store,
                spool_dir=self._spool_dir(),
                # PostgreSQL: every write to the lane table reaches it through the relay.
                lane_pushes=None if self.relay is None else self._relay_listening,
            )
            self.worker.outage.watch(self._outage_changed)
            self.worker.start()
            self.worker.wake()  # runs queued before it listened
        return d

    def _collect(self, _store: Store, *, run_ids: list[int]) -> None:
        """Kill what runs settled on an expired lease left on this host, off the
        dispatcher's thread (a process may take the kill grace to end)."""
        threading.Thread(
            target=local_recovery.collect,
            args=(self.dispatcher.instance_id, run_ids),
            kwargs={"kill_grace": self.config.kill_grace},
            name="jc-collect",
            daemon=True,
        ).start()

    def _outage_changed(self) -> None:
        """An outage of one part began or ended: tell the event stream when the daemon's
        answer (any part down) changed."""
        with self._database_lock:  # sent under it, so the stream has them in order
            state = self.database()
            if state["ok"] == self._database_ok:
                return
            self._database_ok = state["ok"]
            self._database_down_since = None if state["ok"] else state["since"]
            if not state["ok"]:
                self._database_outages += 1
            events.database_changed.send(
                self.dispatcher, ok=state["ok"], since=state["since"], error=state["error"]
            )

    def _spool_dir(self) -> Path:
        return self.spool_dir or self.config.log_root / "spool"

    def _warm_joins(self, d: Dispatcher) -> None:
        """Keep cgroup joins cheap around each timer's due instant (``JoinWarmer``): here,
        where the embedded worker's joins may wait for the kernel, and in worker
        processes, told through the relay (PostgreSQL) as each due instant comes."""
        c = self.containment
        local = c is not None and c.base is not None and c.joins_wait()
        if not local and self.relay is None:
            return
        announce = None if self.relay is None else self._announce_timers_due
        self.warmer = JoinWarmer(c.base if local and c is not None else None, announce=announce)
        if local and c is not None:
            c.warmer = self.warmer
        d.timers.watch(self.warmer.timer_changed)
        for key, when in d.timers.armed().items():  # armed by recovery, before the watch
            self.warmer.timer_changed(key, when)
        self.warmer.start()
        if local:
            log.info("cgroup joins are kept warm around each timer's due instant")

    def _announce_timers_due(self, seconds: float) -> None:
        events.timers_due.send(self.store, seconds=round(seconds, 4))

    def _relay_listening(self) -> bool:
        return self.relay is not None and self.relay.listening

    def stop(
        self, *, kill_running: bool = False, timeout: float = 60.0, remote_too: bool = True
    ) -> None:
        """Stop the dispatcher and the embedded worker; ``kill_running``: kill what runs
        (``remote_too`` False: what runs on workers of their own goes on there,
        ``Dispatcher.stop``)."""
        if kill_running and not remote_too and self.worker is not None:
            # What waits in the queue is left to the workers: the embedded one, stopping,
            # takes no more of it meanwhile (what it runs is killed, as the stop says).
            self.worker.stop_claiming()
        try:
            self.dispatcher.stop(kill_running=kill_running, timeout=timeout, remote_too=remote_too)
        finally:
            events.runs_lost.disconnect(self._collect, sender=self.store)
            if self.worker is not None:
                if kill_running:
                    self.worker.kill_all("killed: the daemon stopped")
                self.worker.stop(timeout)
            if self.warmer is not None:
                self.warmer.close()
            if self.containment is not None:
                self.containment.close()  # the worker closed it too, unless it was replaced
            if self.relay is not None:
                self.relay.stop()
            self.store.stop_checkpointing()

    def containment_view(self) -> str:
        """How this daemon's worker contains task runs (for status)."""
        if self.containment is None:
            return "none: this daemon runs no tasks (--slots 0)"
        advice = self.containment.advice
        return self.containment.describe() + (f"; {advice}" if advice else "")

    def gauges(self) -> dict[str, tuple[str, float]]:
        """The runtime's own series for ``/metrics`` (name -> (help, value))."""
        series: dict[str, tuple[str, float]] = {}
        if gcpause.WATCH is not None:  # a daemon's process (``daemon.serve``)
            series |= gcpause.WATCH.gauges()
        pin = cpupin.monitor()
        if pin is not None:
            series |= pin.gauges()
        checkpointer = self.store.checkpointer
        if checkpointer is not None:
            series["jobcontrol_sqlite_checkpoints_total"] = (
                "WAL checkpoints run by the daemon's checkpoint thread.",
                checkpointer.checkpoints,
            )
            series["jobcontrol_sqlite_checkpoint_failures_total"] = (
                "WAL checkpoints of the daemon's checkpoint thread that failed (retried).",
                checkpointer.failures,
            )
        relay = self.relay
        if relay is not None:
            series |= {
                "jobcontrol_notifications_sent_total": (
                    "Run-queue notifications sent to worker processes (PostgreSQL NOTIFY).",
                    relay.sent,
                ),
                "jobcontrol_notifications_skipped_total": (
                    "Run-queue notifications not sent: no worker process listened.",
                    relay.skipped,
                ),
                "jobcontrol_notifications_dropped_total": (
                    "Run-queue notifications dropped: the database did not answer.",
                    relay.dropped,
                ),
                "jobcontrol_notification_peers": (
                    "Worker processes whose relay the daemon's knows (sent to while > 0).",
                    len(relay.peers),
                ),
            }
        warmer = self.warmer
        if warmer is None:
            return series
        return series | {
            "jobcontrol_cgroup_warm_moves_total": (
                "Moves of the helper that keeps cgroup joins cheap around timers.",
                warmer.moves,
            ),
            "jobcontrol_cgroup_warm_announcements_total": (
                "Times worker processes were told that timers are about to queue runs.",
                warmer.announced,
            ),
            "jobcontrol_cgroup_warm_failures_total": (
                "Helper starts, moves or announcements that failed (joins may wait meanwhile).",
                warmer.failures,
            ),
        }

    def database(self) -> dict[str, Any]:
        """Whether the database answers, as the dispatcher and the worker see it."""
        parts = {"dispatcher": self.dispatcher.outage.state()}
        if self.worker is not None:
            parts["worker"] = self.worker.outage.state()
        if self.relay is not None:
            parts["notifications"] = self.relay.outage.state()
        down = {name: s for name, s in parts.items() if s.down}
        began = [s.since for s in down.values() if s.since]
        kept = self._database_down_since
        if down and kept is not None:
            began.append(kept)
        return {
            "ok": not down,
            "since": min(began, default=None),
            "error": next((s.error for s in down.values()), None),
            # As the daemon sees it: one outage from the first part down to the last back.
            "outages": self._database_outages,
            "errors": sum(s.failures for s in parts.values()),
            "parts": {name: _brief(s) for name, s in parts.items()},
        }


def _brief(state: OutageState) -> dict[str, Any]:
    return {"ok": not state.down, "since": state.since, "error": state.error}
