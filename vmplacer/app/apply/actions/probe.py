"""Probe: a short profiling run on a host; it changes nothing, so there is nothing to undo.

A probe with a `trial` parameter also judges the moves it follows (core/rebalance/trial.py):
it compares what it measured with the host's measurement before those moves (the
run's profile, or the previous trial's probe) and, when the verdict is to go back,
`rejected` says why, and the executor undoes the moves the probe depends on. A trial
of migrations names every host they link (`trial["hosts"]`): all are measured and
judged as one, so the guests that moved count on both sides. A verdict within the trial's
`recheck` margin of its bar is a close call: the hosts are probed once more and the verdict
rests on both measurements. Each verdict is also handed to `on_verdict` (the API counts them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import replace

from vmplacer.app.apply.actions.base import ActionKind, Check
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.core.rebalance.plan import Action, Plan
from vmplacer.core.rebalance.trial import CLOSE_CALL_NOTE, Measured, TrialError, Verdict, close_call, combined, judge, pooled
from vmplacer.ports import Hypervisor

log = logging.getLogger(__name__)

ProbeResult = str | Measured
# Told of each trial's verdict: (the probe's host, the trial's kind, the verdict).
OnVerdict = Callable[[str, str, Verdict], None]


class Probe(ActionKind):
    kinds = ("probe",)

    def __init__(self, hosts: Mapping[str, Hypervisor], *, probe: Callable[[str, float], ProbeResult] | None,
                 measurements: MutableMapping[str, Measured] | None = None, on_verdict: OnVerdict | None = None):
        super().__init__(hosts)
        self.probe = probe
        self.on_verdict = on_verdict
        # The latest measurement of each host's current layout: the run's profile, then each kept trial.
        self.measurements: MutableMapping[str, Measured] = measurements if measurements is not None else {}
        self.verdicts: dict[int, Verdict] = {}

    def precheck(self, action: Action, plan: Plan | None = None) -> Check:
        if self.probe is None:
            return Check(False, "no profiler is available to probe with")
        return Check(True)

    def execute(self, action: Action) -> None:
        assert self.probe is not None
        seconds = float(action.parameters.get("seconds", 5.0))
        trial = action.parameters.get("trial")
        if not trial:
            result = self.probe(action.host, seconds)
            if isinstance(result, Measured):
                # a baseline probe measures the layout the run's profile measured: both count
                previous = self.measurements.get(action.host) if action.parameters.get("baseline") else None
                self.measurements[action.host] = pooled(previous, result)
            return
        hosts = trial_hosts(action)
        after = self._measure(hosts, seconds)
        before = combined(action.host, [self.measurements.get(host) for host in hosts])
        verdict = self._judge(action, before, after, hosts)
        try:
            again = close_call(verdict, kind=str(trial.get("kind")), min_gain=float(trial.get("min_gain", 0.0)),
                               tolerance=float(trial.get("tolerance", 0.0)), margin=float(trial.get("recheck", 0.0)))
        except (TypeError, ValueError):
            again = False
        if again:
            second = self._measure(hosts, seconds)
            if set(second) >= set(after):
                after = {host: pooled(after.get(host), measured) for host, measured in second.items()}
                verdict = self._judge(action, before, after, hosts)
                verdict = replace(verdict, text=f"{verdict.text}; {CLOSE_CALL_NOTE}", close_call="measured_twice")
            else:  # a host the second probe could not measure: the first measurement stands alone
                verdict = replace(verdict, text=f"{verdict.text}; a close call, but the second probe failed "
                                                f"on {', '.join(sorted(set(after) - set(second)))}",
                                  close_call="second_probe_failed")
        self.verdicts[action.index] = verdict
        self._tell(action, verdict)
        if verdict.keep:
            self.measurements.update(after)

    def _tell(self, action: Action, verdict: Verdict) -> None:
        """Hand the verdict to `on_verdict`; a listener that fails must not change the trial."""
        if self.on_verdict is None:
            return
        try:
            self.on_verdict(action.host, str(action.parameters["trial"].get("kind")), verdict)
        except Exception as exc:  # noqa: BLE001 - the verdict stands whatever the listener does
            log.warning("%s: the trial's verdict was not reported: %s", action.describe(), exc)

    def _measure(self, hosts: list[str], seconds: float) -> dict[str, Measured]:
        """Probe each host; the hosts it could measure."""
        assert self.probe is not None
        results = {host: self.probe(host, seconds) for host in hosts}
        return {host: r for host, r in results.items() if isinstance(r, Measured)}

    @staticmethod
    def _judge(action: Action, before: Measured | None, after: Mapping[str, Measured], hosts: list[str]) -> Verdict:
        trial = action.parameters["trial"]
        measured = combined(action.host, [after.get(host) for host in hosts])
        try:
            return judge(before, measured, kind=str(trial.get("kind")),
                         weights={str(g): float(w) for g, w in dict(trial.get("weights") or {}).items()},
                         fairness=float(trial.get("fairness", 0.0)), min_gain=float(trial.get("min_gain", 0.0)),
                         tolerance=float(trial.get("tolerance", 0.0)))
        except (TrialError, TypeError, ValueError) as exc:
            return Verdict(str(trial.get("kind")) == "confirm", None, None, None, 0,
                           f"the measurement could not be judged ({exc})")

    def rejected(self, action: Action) -> str | None:
        """Why the moves this trial probe follows must be undone; None to keep them."""
        verdict = self.verdicts.get(action.index)
        return None if verdict is None or verdict.keep else verdict.text

    def verify(self, action: Action) -> str:
        return ""

    def revert(self, action: Action) -> None:
        return

    def done(self, action: Action) -> str:
        verdict = self.verdicts.get(action.index)
        return verdict.text if verdict is not None else "probed"

    def placement_before(self, action: Action) -> Placement | None:
        return None


def trial_hosts(action: Action) -> list[str]:
    """The hosts a trial probe measures: its own, and with migrations every host they link."""
    trial = action.parameters.get("trial")
    hosts = trial.get("hosts") if isinstance(trial, Mapping) else None
    if isinstance(hosts, (list, tuple)) and hosts and all(isinstance(h, str) for h in hosts):
        return list(dict.fromkeys([action.host, *hosts]))
    return [action.host]
