"""The job kinds this instance can run, by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmplacer.api.profiling import PROFILE_JOB, profile_handler
from vmplacer.api.protecting import PROTECT_JOB, protect_handler
from vmplacer.app.jobs import Handler

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices


def handlers(services: ApiServices) -> dict[str, Handler]:
    from vmplacer.api import plans_support

    table: dict[str, Handler] = {PROFILE_JOB: profile_handler(services), PROTECT_JOB: protect_handler(services)}
    table.update(plans_support.job_handlers(services))
    return table
