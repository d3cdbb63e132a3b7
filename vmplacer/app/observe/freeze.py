"""Freezing co-located domains for a few milliseconds, with the guarantee that
vmplacer never leaves a domain paused.

Five layers of that guarantee:

1. Journal first. Before the first suspend, a row naming the host, the
   domains (name + UUID), a deadline and the owning process (and its
   guardian) is committed. No row, no freeze.
2. Resume in `finally`, in parallel, retried; the row is deleted only once
   every domain runs again.
3. A watchdog thread resumes everything once `max_freeze_s` has passed since
   the first suspend, whatever the caller is doing (a hung sampler, a slow
   database). A suspend that lands after the watchdog fired is undone by the
   thread that issued it.
4. A guardian outside this process (the `FreezeGuard` port), armed with the
   row before the first suspend: it resumes the row's domains at the
   deadline (plus a small margin) if the row is still armed, and at once
   when this process dies, whatever killed it (SIGKILL, its process group,
   OOM). No guardian, no freeze.
5. Replay. What kills both (a cgroup kill, a reboot of the controller)
   leaves the row; `replay_journal` — run when the profiler and the API
   start, every second by `vmplacer serve` and `vmplacer guard`, and by the
   systemd units' ExecStopPost — resumes every domain of a row whose owner
   and guardian are both dead, or which is past its deadline, that is still
   paused *by a user request* (libvirt pause reason "user", which is what
   suspend sets). A domain paused by someone else before the freeze is never
   in a row: only running domains are frozen. A domain paused for another
   reason (migration, I/O error, save) is not touched.

Known limit: libvirt's suspend of an already paused domain succeeds without
doing anything, so a domain someone pauses in the ~0.1 ms between the state
read and our suspend, or while we hold it frozen, would be resumed by us.
The window is one freeze wide (milliseconds), and it is the only one: the
guardian and a replay resume only rows still open, and a freezer that
ended closes its row before it returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field

from vmplacer.ports import (
    DomainGone,
    DomainStatus,
    FreezableHost,
    FreezeGuard,
    FreezeJournal,
    HypervisorError,
)

log = logging.getLogger(__name__)

RESUME_ATTEMPTS = 3
RESUME_RETRY_S = 0.02
# How long the main thread waits for the watchdog's resumes before giving up on them, and
# for a resume the daemon does not answer (libvirt waits for QEMU's monitor without a bound):
# the row stays, and the guardian or a replay resumes the domain once the daemon answers.
WATCHDOG_JOIN_S = 30.0
# A suspend still unanswered this long after max_freeze aborts the freeze instead of holding
# the caller: the watchdog has resumed the others by then, and the thread that issued the
# late suspend undoes it when it lands.
SUSPEND_ANSWER_GRACE_S = 2.0


class FreezeAborted(RuntimeError):
    """The freeze could not be set up (journal unavailable, a suspend failed);
    everything that was suspended has been resumed again."""

    def __init__(self, message: str, *, domain: str = ""):
        super().__init__(message)
        self.domain = domain


@dataclass
class FreezeReport:
    """What one freeze did and how long each part took (milliseconds)."""

    host: str
    frozen: tuple[str, ...] = ()
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why it was not frozen
    journal_id: int | None = None
    suspend_ms: float = 0.0  # first suspend issued -> all suspends returned
    resume_ms: float = 0.0  # first resume issued -> all resumes returned
    span_ms: float = 0.0  # first suspend issued -> last resume returned: the neighbours' frozen time
    watchdog_fired: bool = False
    resume_failures: dict[str, str] = field(default_factory=dict)
    _expired: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def expired(self) -> bool:
        """True once the watchdog resumed the neighbours: the sample is no longer isolated."""
        return self._expired.is_set()


@dataclass
class _Freeze:
    """Shared state of one freeze between the caller's thread, the workers and the watchdog."""

    report: FreezeReport
    lock: threading.Lock = field(default_factory=threading.Lock)
    issued: list[str] = field(default_factory=list)  # suspends issued (maybe still in flight)
    released: bool = False  # resume phase started (by the caller or the watchdog)
    resumed_event: threading.Event = field(default_factory=threading.Event)
    journal_closed: bool = False
    first_suspend: float = 0.0


class Freezer:
    """Suspends a set of domains on one host in parallel, and always resumes them."""

    def __init__(
        self,
        host: FreezableHost,
        journal: FreezeJournal,
        *,
        max_freeze_s: float,
        owner: dict[str, object],
        excluded: Sequence[str] = (),
        workers: int = 16,
        on_phase: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        guard: FreezeGuard | None = None,
    ):
        if max_freeze_s <= 0:
            raise ValueError(f"max_freeze_s must be positive, got {max_freeze_s}")
        self.host = host
        self.journal = journal
        self.max_freeze_s = max_freeze_s
        self.owner = owner
        self.excluded = frozenset(excluded)
        self.on_phase = on_phase or (lambda _phase: None)
        self.clock = clock
        self.guard = guard
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"freeze-{host.name}")
        self._in_flight: set[Future[None]] = set()
        self._in_flight_lock = threading.Lock()

    def close(self) -> None:
        """Wait for the calls still in flight (a late suspend is undone by its thread), but
        not forever: a daemon that never answers must not hold its caller."""
        with self._in_flight_lock:
            pending = list(self._in_flight)
        _, stuck = wait(pending, timeout=WATCHDOG_JOIN_S)
        if stuck:
            log.error("host %s: %d libvirt call(s) of a freeze still unanswered after %.0f s; "
                      "the journal row and the guardian cover their domains", self.host.name, len(stuck),
                      WATCHDOG_JOIN_S)
        self._pool.shutdown(wait=not stuck)

    def _submit(self, call: Callable[..., None], *args: object) -> Future[None]:
        future = self._pool.submit(call, *args)
        with self._in_flight_lock:
            self._in_flight.add(future)
        future.add_done_callback(self._settled)
        return future

    def _settled(self, future: Future[None]) -> None:
        with self._in_flight_lock:
            self._in_flight.discard(future)

    # ----- the freeze ----------------------------------------------------------------
    @contextmanager
    def freeze(self, names: Sequence[str], states: Mapping[str, DomainStatus] | None = None,
               parallel: bool = True) -> Iterator[FreezeReport]:
        """Suspend the running domains among `names` for the duration of the block.

        Domains that are not running (already paused by someone, shut off,
        unknown) and excluded ones are skipped and listed in the report.
        Raises FreezeAborted, with everything resumed, if the journal cannot
        be written or a suspend fails. `parallel=False` suspends one by one
        (for measuring what parallelism gains).
        """
        report = FreezeReport(host=self.host.name)
        states = dict(states) if states is not None else self.host.domain_states()
        targets: list[str] = []
        for name in dict.fromkeys(names):
            status = states.get(name)
            if name in self.excluded:
                report.skipped[name] = "excluded from freezing"
            elif status is None:
                report.skipped[name] = "not on the host"
            elif not status.running:
                report.skipped[name] = f"not running ({status.state}" + (
                    f", {status.pause_reason})" if status.pause_reason else ")")
            else:
                targets.append(name)
        if not targets:
            yield report
            return

        domains = [(n, states[n].uuid) for n in targets]
        owner = dict(self.owner)
        if self.guard is not None:
            try:
                owner["guardian"] = self.guard.identity()
            except Exception as exc:  # noqa: BLE001 - no guardian, no freeze
                raise FreezeAborted(f"host {self.host.name}: freeze guardian unavailable, not freezing: {exc}") from exc
        try:
            report.journal_id = self.journal.open(self.host.name, domains, self.max_freeze_s, owner)
        except Exception as exc:  # noqa: BLE001 - whatever the store raised, we must not freeze
            raise FreezeAborted(f"host {self.host.name}: freeze journal unavailable, not freezing: {exc}") from exc
        self.on_phase("journaled")
        if self.guard is not None:
            try:
                self.guard.arm(report.journal_id, self.host.name, domains, self.max_freeze_s)
            except Exception as exc:  # noqa: BLE001 - nothing is suspended yet: undo the row, refuse
                self._drop_row(report.journal_id)
                raise FreezeAborted(f"host {self.host.name}: freeze guardian unavailable, not freezing: {exc}") from exc
            self.on_phase("guarded")

        state = _Freeze(report)
        done = threading.Event()
        state.first_suspend = self.clock()
        watchdog = threading.Thread(target=self._watchdog, args=(state, done), daemon=True,
                                    name=f"freeze-watchdog-{self.host.name}")
        watchdog.start()
        failures: dict[str, BaseException] = {}
        try:
            self.on_phase("suspending")
            if parallel:
                futures: dict[str, Future[None]] = {n: self._submit(self._suspend_one, state, n)
                                                    for n in targets}
                wait(futures.values(), timeout=self.max_freeze_s + SUSPEND_ANSWER_GRACE_S)
                for name, future in futures.items():
                    if not future.done():
                        failures[name] = HypervisorError(
                            f"no answer to suspend within {self.max_freeze_s + SUSPEND_ANSWER_GRACE_S:g} s",
                            host=self.host.name, domain=name)
                        continue
                    try:
                        future.result()
                    except BaseException as exc:  # noqa: BLE001 - collected, reported below
                        failures[name] = exc
            else:
                for name in targets:
                    try:
                        self._suspend_one(state, name)
                    except BaseException as exc:  # noqa: BLE001
                        failures[name] = exc
                        break
            report.suspend_ms = (self.clock() - state.first_suspend) * 1e3
            report.frozen = tuple(n for n in targets if n in state.issued and n not in failures)
            if failures:
                name, failure = next(iter(failures.items()))
                kind = "disappeared" if isinstance(failure, DomainGone) else "failed to suspend"
                raise FreezeAborted(f"host {self.host.name}: domain {name} {kind} mid-freeze: {failure}",
                                    domain=name)
            self.on_phase("suspended")
            yield report
        finally:
            done.set()
            self._release(state, by_watchdog=False)
            watchdog.join(timeout=WATCHDOG_JOIN_S)
            self.on_phase("resumed")

    # ----- parts ------------------------------------------------------------------------
    def _suspend_one(self, state: _Freeze, name: str) -> None:
        with state.lock:
            if state.released:
                return  # the watchdog (or an abort) already ended this freeze
            state.issued.append(name)
        self.on_phase(f"suspend:{name}")
        self.host.suspend(name)
        with state.lock:
            late = state.released
        if late:
            # Landed after the resume phase began: nobody else will resume it.
            self._resume_one(state, name)

    def _resume_one(self, state: _Freeze, name: str) -> None:
        self.on_phase(f"resume:{name}")
        for attempt in range(RESUME_ATTEMPTS):
            try:
                self.host.resume(name)
                return
            except DomainGone:
                return  # nothing left to resume
            except HypervisorError as exc:
                if attempt + 1 == RESUME_ATTEMPTS:
                    with state.lock:
                        state.report.resume_failures[name] = str(exc)
                    log.error("host %s: could not resume %s after %d attempts: %s",
                              self.host.name, name, RESUME_ATTEMPTS, exc)
                    return
                time.sleep(RESUME_RETRY_S * (attempt + 1))

    def _release(self, state: _Freeze, *, by_watchdog: bool) -> None:
        """Resume every issued suspend once (whichever thread gets here first does it)."""
        with state.lock:
            if state.released:
                first = False
            else:
                state.released = True
                first = True
                if by_watchdog:
                    state.report.watchdog_fired = True
                    state.report._expired.set()
                names = list(state.issued)
        if not first:
            if not by_watchdog:
                state.resumed_event.wait(WATCHDOG_JOIN_S)  # the watchdog is resuming: let it finish
            return
        self.on_phase("resuming")
        started = self.clock()
        futures = {name: self._submit(self._resume_one, state, name) for name in names}
        wait(futures.values(), timeout=WATCHDOG_JOIN_S)
        for name, future in futures.items():
            if not future.done():
                with state.lock:
                    state.report.resume_failures[name] = f"no answer to resume within {WATCHDOG_JOIN_S:g} s"
                log.error("host %s: resume of %s unanswered after %.0f s; the journal row stays for the "
                          "guardian and replay", self.host.name, name, WATCHDOG_JOIN_S)
        ended = self.clock()
        state.report.resume_ms = (ended - started) * 1e3
        state.report.span_ms = (ended - state.first_suspend) * 1e3
        state.report._expired.set()
        self._close_journal(state)
        if self.guard is not None and not state.report.resume_failures and state.report.journal_id is not None:
            try:
                self.guard.disarm(state.report.journal_id)
            except Exception as exc:  # noqa: BLE001 - an armed guardian only re-checks running domains
                log.warning("host %s: freeze guardian not disarmed: %s", self.host.name, exc)
        state.resumed_event.set()

    def _close_journal(self, state: _Freeze) -> None:
        report = state.report
        if report.resume_failures or report.journal_id is None:
            return  # keep the row: replay will retry these domains
        with state.lock:
            if state.journal_closed:
                return
            state.journal_closed = True
        try:
            self.journal.close(report.journal_id)
        except Exception as exc:  # noqa: BLE001 - the row only makes a later replay check running domains
            log.warning("host %s: freeze journal row %s not cleared: %s", self.host.name, report.journal_id, exc)

    def _drop_row(self, entry_id: int) -> None:
        try:
            self.journal.close(entry_id)
        except Exception as exc:  # noqa: BLE001 - a row with nothing suspended is closed by a replay
            log.warning("host %s: freeze journal row %s not cleared: %s", self.host.name, entry_id, exc)

    def _watchdog(self, state: _Freeze, done: threading.Event) -> None:
        remaining = self.max_freeze_s - (self.clock() - state.first_suspend)
        if done.wait(max(0.0, remaining)):
            return
        log.warning("host %s: freeze exceeded max_freeze %.0f ms, resuming %s",
                    self.host.name, self.max_freeze_s * 1e3, ", ".join(state.issued) or "nothing")
        self._release(state, by_watchdog=True)


# ----- replay -----------------------------------------------------------------------------


@dataclass
class ReplayReport:
    resumed: list[tuple[str, str]] = field(default_factory=list)  # (host, domain)
    left_alone: list[tuple[str, str, str]] = field(default_factory=list)  # (host, domain, why)
    live_entries: list[int] = field(default_factory=list)  # rows of freezers still at work
    closed_entries: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # One per replayed row: {journal_id, host, cause, resumed, errors, overrun_s} (for the audit log).
    rescues: list[dict[str, object]] = field(default_factory=list)
    # Why the journal could not be read (the store's own exception), for the caller to word.
    journal_error: Exception | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, object]:
        return {
            "resumed": [{"host": h, "domain": d} for h, d in self.resumed],
            "left_alone": [{"host": h, "domain": d, "why": w} for h, d, w in self.left_alone],
            "live_entries": self.live_entries,
            "closed_entries": self.closed_entries,
            "errors": self.errors,
        }


# A row whose owner or guardian may still be at work is theirs until its deadline plus this:
# the guardian acts at deadline + its margin (0.25 s), a replay only after it.
HANDOFF_S = 0.5


def _keeper_alive(owner: dict[str, object], owner_alive: Callable[[dict[str, object]], bool | None]) -> bool | None:
    """Is the freezing process or its guardian alive? None when unknowable (another machine)."""
    verdicts = [owner_alive(owner)]
    guardian = owner.get("guardian")
    if isinstance(guardian, dict):
        verdicts.append(owner_alive({**guardian, "hostname": owner.get("hostname")}))
    if True in verdicts:
        return True
    return None if None in verdicts else False


def replay_journal(
    journal: FreezeJournal,
    hosts: Mapping[str, FreezableHost] | Callable[[str], FreezableHost],
    owner_alive: Callable[[dict[str, object]], bool | None],
    *,
    now: Callable[[], float] = time.time,
    host: str | None = None,
    cause: str = "replay",
) -> ReplayReport:
    """Resume domains that a vmplacer process froze and did not resume.

    A row is replayed at once when its owner and its guardian are both dead;
    otherwise (one of them alive, or unknowable because it ran on another
    machine) once it is HANDOFF_S past its deadline: by then the owner's
    watchdog and the guardian should both have acted, so a resume failed.
    `cause` is recorded with each replayed row in `rescues`.
    """
    report = ReplayReport()
    try:
        entries = journal.pending(host)
    except Exception as exc:  # noqa: BLE001 - report, let the caller decide
        report.errors.append(f"freeze journal unreadable: {str(exc).splitlines()[0] if str(exc) else exc!r}")
        report.journal_error = exc
        return report
    lookup = hosts if callable(hosts) else hosts.get
    for entry in entries:
        alive = _keeper_alive(entry.owner, owner_alive)
        if alive is not False and now() < entry.deadline_at + HANDOFF_S:
            report.live_entries.append(entry.id)
            continue
        try:
            target = lookup(entry.host)
        except Exception as exc:  # noqa: BLE001 - e.g. the host left the configuration
            target, why = None, str(exc)
        else:
            why = "not configured"
        if target is None:
            report.errors.append(f"freeze journal row {entry.id}: host {entry.host}: {why}")
            continue
        try:
            states = target.domain_states()
        except HypervisorError as exc:
            report.errors.append(f"freeze journal row {entry.id}: {exc}")
            continue
        complete = True
        resumed_here: list[str] = []
        errors_before = len(report.errors)
        for name, uuid in entry.domains:
            status = states.get(name)
            if status is None or (uuid and status.uuid != uuid):
                continue  # gone, or a different domain under the same name now
            if status.state != "paused":
                continue
            if status.pause_reason != "user":
                report.left_alone.append((entry.host, name, f"paused for {status.pause_reason}, not by vmplacer"))
                continue
            try:
                target.resume(name)
                report.resumed.append((entry.host, name))
                resumed_here.append(name)
            except DomainGone:
                continue
            except HypervisorError as exc:
                complete = False
                report.errors.append(f"host {entry.host}: resuming {name}: {exc}")
        report.rescues.append({
            "journal_id": entry.id, "host": entry.host, "cause": cause, "resumed": resumed_here,
            "errors": report.errors[errors_before:], "overrun_s": max(0.0, now() - entry.deadline_at)})
        if complete:
            try:
                journal.close(entry.id)
                report.closed_entries.append(entry.id)
            except Exception as exc:  # noqa: BLE001
                report.errors.append(f"freeze journal row {entry.id}: not cleared: {exc}")
    if report.resumed:
        log.warning("freeze journal replay resumed %s",
                    ", ".join(f"{h}/{d}" for h, d in report.resumed))
    return report
