"""Composition root: settings → adapters → application services, for the CLI and the API.

The only package that knows which concrete adapters exist; front ends receive
what it builds and never import `adapters.db` themselves.

    container.py  Container: engine (a pooled one for servers), stores, hypervisors,
                  XML policies, renderer, placement service, reconciler, model
    profiler.py   Freeze'nSense: settings → ProfilerConfig, profilers, journal replay
    rebalance.py  the rebalancer (plans, leases, executor, learning, probes)
    protect.py    the protection loop

Importing this package loads nothing heavy: `Container` is resolved on first use,
so a command that needs no database never imports SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vmplacer.bootstrap.container import Container, ServerContainer

__all__ = ["Container", "ServerContainer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from vmplacer.bootstrap import container

        return getattr(container, name)
    raise AttributeError(f"module 'vmplacer.bootstrap' has no attribute {name!r}")
