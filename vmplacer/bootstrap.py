"""Composition root: settings → adapters → application services.

The only module that knows which concrete adapters exist; everything else
receives them. Built lazily, so commands that need no host or database
(help, dry runs on a capabilities file) never open one.
"""

from __future__ import annotations

from functools import cached_property

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from vmplacer.config import ConfigError, Settings


class Container:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._hypervisors: dict[str, object] = {}
        self._xml_policies: dict[str, object] = {}

    @cached_property
    def engine(self) -> Engine:
        from vmplacer.adapters.db.engine import make_engine

        return make_engine(self.settings.database_url)

    @cached_property
    def sessions(self) -> sessionmaker[Session]:
        from vmplacer.adapters.db.engine import make_session_factory

        return make_session_factory(self.engine)

    def upgrade_database(self) -> None:
        from vmplacer.adapters.db.migrate import upgrade

        upgrade(self.settings.database_url)

    def hypervisor(self, name: str):  # -> LibvirtHost
        """The libvirt adapter of a configured host (raises ConfigError if unknown)."""
        if name not in self._hypervisors:
            from vmplacer.adapters.libvirt_host import LibvirtHost

            self._hypervisors[name] = LibvirtHost(self.settings.host(name))
        return self._hypervisors[name]

    @cached_property
    def placement_store(self):  # -> SqlPlacementStore
        from vmplacer.adapters.db.placements import SqlPlacementStore

        return SqlPlacementStore(self.sessions)

    def placement_service(self):  # -> PlacementService
        from vmplacer.adapters.domain_xml import render_domain
        from vmplacer.app.placement_service import PlacementService

        def render(spec, placement, base_xml):  # type: ignore[no-untyped-def]
            """Render, then hold the result to the host's domain XML policy before libvirt sees it."""
            host = self.settings.host(placement.host)
            xml = render_domain(spec, placement, base_xml=base_xml, domain_type=host.domain_type)
            self.xml_policy(placement.host).check(xml, spec.name, "the rendered domain XML")
            return xml

        return PlacementService(self.placement_store, render, self.allocation_options, self.admission)

    @cached_property
    def admission(self):  # -> ModelAdmission
        """The scorer source of every placement path: the stored interference model (read
        lazily, reloaded every `placement.model_refresh`), weighted as configured."""
        from vmplacer.app.admission import ModelAdmission
        from vmplacer.core.interference_scorer import AdmissionSettings

        placement = self.settings.placement
        return ModelAdmission(self._stored_model_if_any, AdmissionSettings(placement.interference_weight,
                                                                           placement.interference_candidates),
                              refresh_s=placement.model_refresh_s)

    def _stored_model_if_any(self):  # -> InterferenceModel
        """The learned model; an empty one when the database has none yet — without creating
        a database a dry run (`plan`) would otherwise leave behind."""
        from pathlib import Path

        from sqlalchemy import inspect
        from sqlalchemy.engine import make_url

        from vmplacer.core.interference import InterferenceModel

        url = make_url(self.settings.database_url)
        if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
            return InterferenceModel()
        if not inspect(self.engine).has_table("interference_models"):
            return InterferenceModel()
        return self.load_model()

    def xml_policy(self, host_name: str):  # -> DomainXmlPolicy
        """The domain XML policy of a configured host (raises ConfigError if unknown). Kept per
        host, so the facts it reads from the host (emulators, storage pools) are cached."""
        policy = self._xml_policies.get(host_name)
        if policy is None:
            from vmplacer.adapters.domain_xml_policy import DomainXmlPolicy
            from vmplacer.adapters.libvirt_facts import host_facts

            settings = self.settings.host(host_name).xml_policy
            policy = self._xml_policies.setdefault(host_name, DomainXmlPolicy(
                host_name, allow=settings.allow, storage_paths=settings.storage_paths,
                facts=lambda: host_facts(self.hypervisor(host_name),
                                         read_pools=settings.storage_paths is None)))
        return policy

    def reconciler(self, holder: str, store=None):  # -> Reconciler
        """Placement records against libvirt on every configured host, acting under `holder`
        in the host leases (the CLI and the API build it the same way); `store`: a placement
        store auditing as someone else than vmplacer (the API's caller)."""
        from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlacementUpdates, SqlPlanStore
        from vmplacer.adapters.db.throttles import SqlThrottleLedger
        from vmplacer.app.reconcile import Reconciler

        leases = SqlLeaseStore(self.sessions)
        hosts = {h.name: self.hypervisor(h.name) for h in self.settings.hosts}

        def holder_of(host: str) -> str | None:
            return leases.holders([host]).get(host, {}).get("holder")

        return Reconciler(hosts, store or self.placement_store, leases, holder=holder, lease_holder=holder_of,
                          placements=SqlPlacementUpdates(self.sessions, {h.name: h.uri for h in self.settings.hosts}),
                          plans=SqlPlanStore(self.sessions), throttles=SqlThrottleLedger(self.sessions))

    def allocation_options(self, host_name: str):  # -> AllocationOptions
        """The configured allocation knobs of a host (defaults for hosts not in the config)."""
        from vmplacer.config import ConfigError
        from vmplacer.core.policies.admit import AllocationOptions

        try:
            return self.settings.host(host_name).allocation
        except ConfigError:
            return AllocationOptions()

    @cached_property
    def maintenance(self):  # -> SqlMaintenanceStore
        from vmplacer.adapters.db.maintenance import SqlMaintenanceStore

        return SqlMaintenanceStore(self.sessions)

    @cached_property
    def model_repository(self):  # -> SqlModelRepository
        from vmplacer.adapters.db.models_repo import SqlModelRepository

        return SqlModelRepository(self.sessions)

    def load_model(self):  # -> InterferenceModel
        """The learned interference model (the linear predictor until samples exist)."""
        return self.model_repository.load()[0]

    def default_host_name(self) -> str:
        if not self.settings.hosts:
            raise ConfigError("no hosts configured")
        return self.settings.hosts[0].name

    def close(self) -> None:
        for hypervisor in self._hypervisors.values():
            hypervisor.close()  # type: ignore[attr-defined]
        self._hypervisors.clear()
        if "engine" in self.__dict__:
            self.engine.dispose()
