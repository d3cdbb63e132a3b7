"""TimedValue: the short cache dry runs read maintenance from."""

from __future__ import annotations

from vmplacer.api.hostcache import TimedValue


def test_reads_once_per_ttl_and_again_after_invalidate():
    now = [0.0]
    loads: list[int] = []

    def load() -> dict[str, int]:
        loads.append(1)
        return {"n": len(loads)}

    value = TimedValue(load, 1.0, clock=lambda: now[0])
    assert value.get() == {"n": 1}
    now[0] = 0.5
    assert value.get() == {"n": 1}
    value.invalidate()
    assert value.get() == {"n": 2}
    now[0] = 2.0
    assert value.get() == {"n": 3}
    assert len(loads) == 3
