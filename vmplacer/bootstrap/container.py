"""The container: settings → every adapter (engine, stores, hypervisors, renderer) and the
services built on them.

The only place that knows which concrete adapters exist; everything else
receives them. Built lazily, so commands that need no host or database
(help, dry runs on a capabilities file) never open one. Front ends reach the
database only through the stores and queries exposed here.
"""

from __future__ import annotations

import threading
from functools import cached_property
from typing import TYPE_CHECKING, Any

from vmplacer.config import ConfigError, Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine
    from sqlalchemy.orm import Session, sessionmaker

    from vmplacer.adapters.db.api import SqlIdempotencyStore, SqlJobStore, SqlTokenStore
    from vmplacer.adapters.db.pages import SqlPages
    from vmplacer.adapters.db.maintenance import SqlMaintenanceStore
    from vmplacer.adapters.db.models_repo import SqlModelRepository
    from vmplacer.adapters.db.placements import SqlPlacementStore
    from vmplacer.adapters.db.plans import SqlLeaseStore, SqlPlacementUpdates, SqlPlanStore
    from vmplacer.adapters.db.profiles import SqlProfileStore
    from vmplacer.adapters.db.throttles import SqlThrottleLedger
    from vmplacer.adapters.db.web_sessions import SqlWebSessionStore
    from vmplacer.adapters.domain_xml_policy import DomainXmlPolicy
    from vmplacer.adapters.libvirt_host import LibvirtHost
    from vmplacer.app.place.admission import ModelAdmission
    from vmplacer.app.place.placement_service import PlacementService
    from vmplacer.app.observe.reconcile import Reconciler
    from vmplacer.core.model.interference import InterferenceModel
    from vmplacer.core.placement.admit import AllocationOptions

# A server's engine pool: kept open, and opened for bursts (each request thread holds at most
# one connection at a time). Several instances on one server: mind PostgreSQL's max_connections.
SERVER_POOL_SIZE = 10
SERVER_POOL_OVERFLOW = 30


class Container:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._hypervisors: dict[str, LibvirtHost] = {}
        self._hypervisors_lock = threading.Lock()
        self._xml_policies: dict[str, DomainXmlPolicy] = {}

    @cached_property
    def engine(self) -> Engine:
        from vmplacer.adapters.db.engine import make_engine

        return make_engine(self.settings.database_url)

    @cached_property
    def sessions(self) -> sessionmaker[Session]:
        from vmplacer.adapters.db.engine import make_session_factory

        return make_session_factory(self.engine)

    @cached_property
    def web_session_store(self) -> SqlWebSessionStore:
        """The web view's sign-ins, for the configured lifetime and idle time."""
        from vmplacer.adapters.db.web_sessions import SqlWebSessionStore

        web = self.settings.web
        return SqlWebSessionStore(self.sessions, lifetime_s=web.session_lifetime_s, idle_s=web.session_idle_s)

    def upgrade_database(self, revision: str = "head") -> None:
        from vmplacer.adapters.db.migrate import upgrade

        upgrade(self.settings.database_url, revision)

    def downgrade_database(self, revision: str) -> None:
        from vmplacer.adapters.db.migrate import downgrade

        downgrade(self.settings.database_url, revision)

    def database_name(self) -> str:
        """The database URL without its password, for messages."""
        from sqlalchemy.engine import make_url

        return make_url(self.settings.database_url).render_as_string(hide_password=True)

    def prune(self, *, plans_s: float, profiles_s: float, audit_s: float, jobs_s: float, actor: str,
              dry_run: bool = False) -> Any:
        """Delete (or with `dry_run` count) finished records older than their ages, and the web
        view's sign-ins that ended by the configured lifetime and idle time."""
        from vmplacer.adapters.db.retention import Pruner, RetentionAges

        ages = RetentionAges(plans_s=plans_s, profiles_s=profiles_s, audit_s=audit_s, jobs_s=jobs_s)
        return Pruner(self.sessions, web_sessions=self.web_session_store, actor=actor).prune(ages, dry_run=dry_run)

    def hypervisor(self, name: str) -> LibvirtHost:
        """The libvirt adapter of a configured host (raises ConfigError if unknown); one per host
        however many threads ask (hosts are read and profiled at once)."""
        with self._hypervisors_lock:
            if name not in self._hypervisors:
                from vmplacer.adapters.libvirt_host import LibvirtHost

                self._hypervisors[name] = LibvirtHost(self.settings.host(name))
            return self._hypervisors[name]

    @cached_property
    def placement_store(self) -> SqlPlacementStore:
        from vmplacer.adapters.db.placements import SqlPlacementStore

        return SqlPlacementStore(self.sessions)

    def render(self, spec: Any, placement: Any, base_xml: str | None) -> str:
        """Render a guest's domain XML, then hold it to the host's domain XML policy before
        libvirt (or a dry run's caller) sees it (raises DomainXmlPolicyError)."""
        from vmplacer.adapters.domain_xml import domain_text, render_domain_tree

        host = self.settings.host(placement.host)
        # one tree for both: the policy walks what the text says, without parsing the text back
        root = render_domain_tree(spec, placement, base_xml=base_xml, domain_type=host.domain_type)
        self.xml_policy(placement.host).check(root, spec.name, "the rendered domain XML")
        return domain_text(root)

    def placement_service(self, store: Any = None, admit_host: Any = None) -> PlacementService:
        """Placements through `store` (default: the database; a dry run passes host snapshots);
        `admit_host(host)` raises when a host takes no new guest (the API's maintenance check)."""
        from vmplacer.app.place.placement_service import PlacementService

        return PlacementService(store or self.placement_store, self.render, self.allocation_options,
                                self.admission, admit_host=admit_host)

    @cached_property
    def admission(self) -> ModelAdmission:
        """The scorer source of every placement path: the stored interference model (read
        lazily, reloaded every `placement.model_refresh`), weighted as configured."""
        from vmplacer.app.place.admission import ModelAdmission
        from vmplacer.core.placement.interference_scorer import AdmissionSettings

        placement = self.settings.placement
        return ModelAdmission(self._stored_model_if_any, AdmissionSettings(placement.interference_weight,
                                                                           placement.interference_candidates),
                              refresh_s=placement.model_refresh_s)

    def _stored_model_if_any(self) -> InterferenceModel:
        """The learned model; an empty one when the database has none yet — without creating
        a database a dry run (`plan`) would otherwise leave behind."""
        from vmplacer.core.model.interference import InterferenceModel

        if not self.database_has("interference_models"):
            return InterferenceModel()
        return self.load_model()

    def database_has(self, table: str) -> bool:
        """Whether the database exists and holds `table`, asked without creating a SQLite file:
        a dry run on a machine never set up reads no records (there are none) and leaves none."""
        from pathlib import Path

        from sqlalchemy import inspect
        from sqlalchemy.engine import make_url

        url = make_url(self.settings.database_url)
        if url.get_backend_name() == "sqlite" and url.database and not Path(url.database).exists():
            return False
        return bool(inspect(self.engine).has_table(table))

    def xml_policy(self, host_name: str) -> DomainXmlPolicy:
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

    def reconciler(self, holder: str, store: SqlPlacementStore | None = None) -> Reconciler:
        """Placement records against libvirt on every configured host, acting under `holder`
        in the host leases (the CLI and the API build it the same way); `store`: a placement
        store auditing as someone else than vmplacer (the API's caller)."""
        from vmplacer.app.observe.reconcile import Reconciler

        leases = self.lease_store
        hosts = {h.name: self.hypervisor(h.name) for h in self.settings.hosts}

        def holder_of(host: str) -> str | None:
            return leases.holders([host]).get(host, {}).get("holder")

        return Reconciler(hosts, store or self.placement_store, leases, holder=holder, lease_holder=holder_of,
                          placements=self.placement_updates(), plans=self.plan_store,
                          throttles=self.throttle_ledger,
                          emulator_cpus=lambda name: self.allocation_options(name).emulator_cpus)

    def placement_store_as(self, actor: str, detail: dict[str, Any] | None = None) -> SqlPlacementStore:
        """A placement store whose audit entries name `actor` (an API caller) and `detail`."""
        from vmplacer.adapters.db.placements import SqlPlacementStore

        return SqlPlacementStore(self.sessions, actor=actor, actor_detail=detail)

    # ----- stores -------------------------------------------------------------------------------
    def placement_updates(self) -> SqlPlacementUpdates:
        """Placement rows and exclusive-pCPU claims as the executor and reconcile change them."""
        from vmplacer.adapters.db.plans import SqlPlacementUpdates

        return SqlPlacementUpdates(self.sessions, {h.name: h.uri for h in self.settings.hosts})

    @cached_property
    def lease_store(self) -> SqlLeaseStore:
        from vmplacer.adapters.db.plans import SqlLeaseStore

        return SqlLeaseStore(self.sessions)

    def live_leases(self) -> dict[str, dict[str, Any]]:
        """host -> {"holder", "expires_at"} for host leases held right now."""
        return {host: {"holder": info["holder"], "expires_at": info["expires_at"]}
                for host, info in self.lease_store.holders().items() if info.get("live")}

    @cached_property
    def plan_store(self) -> SqlPlanStore:
        from vmplacer.adapters.db.plans import SqlPlanStore

        return SqlPlanStore(self.sessions)

    @cached_property
    def throttle_ledger(self) -> SqlThrottleLedger:
        from vmplacer.adapters.db.throttles import SqlThrottleLedger

        return SqlThrottleLedger(self.sessions)

    @cached_property
    def token_store(self) -> SqlTokenStore:
        from vmplacer.adapters.db.api import SqlTokenStore

        return SqlTokenStore(self.sessions)

    @cached_property
    def idempotency_store(self) -> SqlIdempotencyStore:
        from vmplacer.adapters.db.api import SqlIdempotencyStore

        return SqlIdempotencyStore(self.sessions)

    @cached_property
    def job_store(self) -> SqlJobStore:
        from vmplacer.adapters.db.api import SqlJobStore

        return SqlJobStore(self.sessions)

    @cached_property
    def profile_store(self) -> SqlProfileStore:
        from vmplacer.adapters.db.profiles import SqlProfileStore

        return SqlProfileStore(self.sessions)

    # ----- read-only queries of the front ends ----------------------------------------------------
    @cached_property
    def pages(self) -> SqlPages:
        """The API's lists, keyset-paged, filtered and ordered in SQL."""
        from vmplacer.adapters.db.pages import SqlPages

        return SqlPages(self.sessions)

    def placement_records(self, host: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        from vmplacer.adapters.db.api import placement_records

        return placement_records(self.sessions, host, limit)

    def queue_plan_apply(self, plan_id: int, hosts: list[str], created_by: str, kind: str, *,
                         token_id: int | None = None) -> Any:
        """Approve a plan and queue the job that applies it (raises ApplyRefused, LookupError);
        the job keeps the token's id, so the executor's audit entries name it."""
        from vmplacer.adapters.db.api import queue_plan_apply

        return queue_plan_apply(self.sessions, plan_id, hosts, created_by, kind, token_id=token_id)

    def freeze_rescue_summary(self) -> Any:
        from vmplacer.adapters.db.freeze_rescues import rescue_summary

        return rescue_summary(self.sessions)

    def schema_revisions(self) -> tuple[str | None, str]:
        """(the database's schema revision, the newest this code knows)."""
        from vmplacer.adapters.db.migrate import current_revision, head_revision

        return current_revision(self.engine), head_revision()

    @staticmethod
    def known_revisions() -> list[tuple[str, str]]:
        """(revision, what it does) of every schema migration this code ships, oldest first."""
        from vmplacer.adapters.db.migrate import known_revisions

        return known_revisions()

    def ping_database(self) -> None:
        """One round trip to the database (raises when it is unreachable)."""
        from sqlalchemy import text

        with self.engine.connect() as connection:
            connection.execute(text("SELECT 1"))

    def allocation_options(self, host_name: str) -> AllocationOptions:
        """The configured allocation knobs of a host (defaults for hosts not in the config)."""
        from vmplacer.config import ConfigError
        from vmplacer.core.placement.admit import AllocationOptions

        try:
            return self.settings.host(host_name).allocation
        except ConfigError:
            return AllocationOptions()

    @cached_property
    def maintenance(self) -> SqlMaintenanceStore:
        from vmplacer.adapters.db.maintenance import SqlMaintenanceStore

        return SqlMaintenanceStore(self.sessions)

    @cached_property
    def model_repository(self) -> SqlModelRepository:
        from vmplacer.adapters.db.models_repo import SqlModelRepository

        return SqlModelRepository(self.sessions)

    def load_model(self) -> InterferenceModel:
        """The learned interference model (the linear predictor until samples exist)."""
        return self.model_repository.load()[0]

    def default_host_name(self) -> str:
        if not self.settings.hosts:
            raise ConfigError("no hosts configured")
        return self.settings.hosts[0].name

    def close(self) -> None:
        from vmplacer.app.host_fanout import for_each_host

        with self._hypervisors_lock:
            opened, self._hypervisors = self._hypervisors, {}
        # each connection's callbacks are taken back by a round trip per event: hosts close at
        # once, as they were read
        for_each_host(list(opened), lambda name: opened[name].close(),
                      limit=self.settings.rebalance.parallel_hosts)
        if "engine" in self.__dict__:
            self.engine.dispose()


class ServerContainer(Container):
    """The composition root of a server process: an engine pool sized for concurrent requests.

    The default pool (5 connections + 10 overflow, closed after use) makes a busy
    server open and close PostgreSQL connections all the time; requests run on
    many threads, each holding at most one connection at a time.
    """

    @cached_property
    def engine(self) -> Engine:
        from sqlalchemy.engine import make_url

        from vmplacer.adapters.db.engine import make_engine

        url = self.settings.database_url
        if make_url(url).get_backend_name() == "sqlite" and make_url(url).database in (None, "", ":memory:"):
            return make_engine(url)  # one in-memory database per connection: nothing to pool
        # SQLite too: a fresh connection costs its PRAGMAs, and a pool of 5 + 10 overflow made
        # most requests open one under concurrent placements. A file database serves one
        # server's threads only, so it keeps every connection it may open (an overflow one is
        # closed when returned, and a burst of reads opened one per request); PostgreSQL keeps
        # SERVER_POOL_SIZE, as its max_connections is shared by every instance.
        if make_url(url).get_backend_name() == "sqlite":
            return make_engine(url, pool_size=SERVER_POOL_SIZE + SERVER_POOL_OVERFLOW, max_overflow=0,
                               pool_timeout=30)
        return make_engine(url, pool_size=SERVER_POOL_SIZE, max_overflow=SERVER_POOL_OVERFLOW, pool_timeout=30)
