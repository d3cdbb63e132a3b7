"""The job kinds this instance can run, by name: each resource's module names its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmplacer.api.routes import plans, profiles, protect
from vmplacer.app.jobs import Handler

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices


def handlers(services: ApiServices) -> dict[str, Handler]:
    table: dict[str, Handler] = {profiles.PROFILE_JOB: profiles.profile_handler(services),
                                 protect.PROTECT_JOB: protect.protect_handler(services)}
    table.update(plans.job_handlers(services))
    return table
