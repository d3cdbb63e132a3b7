"""Request and response bodies (the OpenAPI contract).

Guest fields are the ones of a plan request file (`vmplacer plan --request`):
native names, or OpenStack flavor `extra_specs` with `hw:*` keys, validated by
`GuestSpec.from_mapping` so the API, the CLI and request files agree on every
rule and every message. Types here are strict (no "4" for 4) so a client's
mistake is reported, not guessed at.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_serializer,
)
from pydantic_core import CoreSchema

from vmplacer.api.fields import DomainName, Glob, Reason, SelectorText, SpecText, SpecValue, whole_number
from vmplacer.api.times import ApiTime

from vmplacer.core.placement.guest import (
    CPU_POLICIES,
    EMULATOR_POLICIES,
    MAX_HOST_NODE,
    MAX_MEMORY_MIB,
    MAX_NUMA_NODES,
    MAX_VCPUS,
    THREAD_POLICIES,
    WORKLOAD_CLASSES,
)
from vmplacer.core.placement.guest_placement import MEM_MODES
from vmplacer.core.protect.decisions import THROTTLE_FINDINGS
from vmplacer.core.rebalance.plan import ACTION_KINDS, ACTION_STATES, PLAN_STATES
from vmplacer.core.reconcile import ACTIONS as RECONCILE_ACTIONS
from vmplacer.core.reconcile import KINDS as FINDING_KINDS

GUEST_NAME = r"^[A-Za-z0-9_.+][A-Za-z0-9_.+-]{0,63}$"
HOST_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
MAX_BASE_XML = 256 * 1024
ROUTING_FIELDS = ("host", "dry_run", "define", "start", "base_xml")

# Host names are plain strings in the contract, never an enum of this deployment's hosts: a
# host configured later must be nameable without a new client. Routes refuse unknown ones (4xx
# naming the field).
HostName = Annotated[str, Field(pattern=HOST_NAME, min_length=1, max_length=63)]

_NODE_ID = {"type": "integer", "minimum": 0, "maximum": MAX_HOST_NODE}
# Checked by GuestSpec alone (one rule, one message for the API and request files); the
# schema still tells clients the shape: one node id, or guest cell -> node id.
MemoryNode = Annotated[Any, WithJsonSchema({"anyOf": [
    _NODE_ID, {"type": "object", "additionalProperties": _NODE_ID}, {"type": "null"}]})]
_CPU_LIST: dict[str, Any] = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]}
# The flat per-cell keys of a request file (`numa_cpus.1`, `numa_mem.1`, `memory_node.1`): the
# only further keys a placement request takes.
FLAT_CELL_KEYS: dict[str, Any] = {r"^numa_cpus\.[0-9]+$": _CPU_LIST, r"^numa_mem\.[0-9]+$": {"type": "integer"},
                  r"^memory_node\.[0-9]+$": _NODE_ID}


def _whole_numbers(cls: Any, value: Any) -> Any:
    """Integer fields of strict bodies take `4.0` as 4 (`whole_number`), in lists and mappings too."""
    if isinstance(value, dict):
        return {key: _whole_numbers(cls, item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(cls, item) for item in value]
    return whole_number(value)

CpuPolicy = Literal[CPU_POLICIES]  # type: ignore[valid-type]
ThreadPolicy = Literal[THREAD_POLICIES]  # type: ignore[valid-type]
EmulatorPolicy = Literal[EMULATOR_POLICIES]  # type: ignore[valid-type]
WorkloadClass = Literal[WORKLOAD_CLASSES]  # type: ignore[valid-type]
MemMode = Literal[MEM_MODES]  # type: ignore[valid-type]


class Named:
    """One named schema (`#/components/schemas/NAME`) for a Literal wherever it is used, in bodies
    and query parameters alike: a generated client gets one enum per concept, not one per field.
    The value stays a plain `str` in Python."""

    def __init__(self, name: str, description: str):
        self.name = name
        self.description = description

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return {**handler(source), "ref": self.name}  # type: ignore[return-value]

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        found = handler(schema)
        target = handler.resolve_ref_schema(found)
        target.update(title=self.name, description=self.description)
        return found


PLAN_STATE_HELP = ("proposed | approved | running (not final); succeeded | failed | rolled_back | "
                   "cancelled | empty (final: `empty` = no action was worth taking, nothing to apply)")
PlanState = Annotated[Literal[PLAN_STATES],  # type: ignore[valid-type]
                      Named("PlanState", "a rebalancing plan's state: " + PLAN_STATE_HELP)]
PLACEMENT_STATES = ("planned", "defined", "running")
PlacementState = Annotated[Literal[PLACEMENT_STATES], Named(  # type: ignore[valid-type]
    "PlacementState", "a placement's state: planned (a dry run, or pCPUs reserved without a domain) | defined "
    "(the domain is defined, not running) | running")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


# A number the server sends as it computed it: an int stays an int, a float a float (the JSON
# is the same bytes as before these answers were typed); "number" to a client.
Number = Annotated[int | float, WithJsonSchema({"type": "number"})]


class _Sent(BaseModel):
    """A part of an answer the server builds as a dict, typed for clients. Its fields are declared
    in the order the server writes them, so the JSON is the same bytes as the dict; a field the
    server leaves out stays out (not null)."""

    model_config = ConfigDict(extra="forbid")

    @model_serializer(mode="wrap")
    def _as_sent(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """(No return annotation: one would replace this model's schema in the document.)"""
        data = handler(self)
        return {key: value for key, value in data.items()
                if key in self.model_fields_set or key not in type(self).model_fields}


class PlacementRequest(BaseModel):
    """A guest to place, plus where and how. Extra keys `numa_cpus.N` / `numa_mem.N` /
    `memory_node.N` (flat form of the request file) are accepted too."""

    model_config = ConfigDict(strict=True, extra="allow", json_schema_extra={
        "additionalProperties": False, "patternProperties": FLAT_CELL_KEYS})

    name: str = Field(pattern=GUEST_NAME, max_length=64, description="the domain name")
    vcpus: int = Field(ge=1, le=MAX_VCPUS)
    memory_mib: int = Field(ge=1, le=MAX_MEMORY_MIB)
    cpu_policy: CpuPolicy | None = None
    thread_policy: ThreadPolicy | None = None
    dedicated_vcpus: str | list[int] | None = Field(
        default=None, description="cpu_policy mixed: vCPUs with a pCPU of their own, e.g. '0-1' or '^0'")
    numa_nodes: int | None = Field(default=None, ge=1, le=MAX_NUMA_NODES)
    numa_cpus: dict[str, str | list[int]] | None = Field(default=None, description="cell -> vCPU list")
    numa_mem: dict[str, int] | None = Field(default=None, description="cell -> MiB")
    memory_node: MemoryNode = Field(
        default=None, description="host memory-only (CPU-less) NUMA node for the guest's memory: one id for "
        "the whole guest, or cell -> id (needs numa_nodes or numa_cpus/numa_mem); the host must have it")
    mem_mode: MemMode | None = None
    mem_page_size: str | int | None = Field(default=None, description="small, large, any, 2MB, 1GB or KiB")
    emulator_threads: EmulatorPolicy | None = None
    workload_class: WorkloadClass | None = None
    labels: dict[str, str | int | float] | None = None
    affinity: list[str] | None = None
    anti_affinity: list[str] | None = None
    extra_specs: dict[SpecText, SpecValue] | None = Field(
        default=None, description="OpenStack flavor extra specs; hw:* keys are applied, others ignored")

    host: HostName | None = Field(default=None, description="a configured host (another name: 422 naming `host`); "
                                  "omitted: every host is tried, the best score wins")
    dry_run: bool = Field(default=False, description="compute placement and XML only; nothing is recorded")
    define: bool = Field(default=True, description="define the domain in libvirt; false: only reserve the "
                         "pCPUs and return the XML for the caller to define")
    start: bool = Field(default=False, description="start the domain after defining it")
    base_xml: str | None = Field(default=None, max_length=MAX_BASE_XML,
                                 description="the caller's domain XML; vmplacer replaces only what it owns. The "
                                 "server takes at most half of its api.max_request_bytes (422 naming base_xml "
                                 "beyond that)")

    _whole_numbers = field_validator("vcpus", "memory_mib", "dedicated_vcpus", "numa_nodes", "numa_cpus", "numa_mem",
                                     "memory_node", "mem_page_size", mode="before")(_whole_numbers)

    def guest_fields(self) -> dict[str, Any]:
        data = self.model_dump(exclude_none=True, exclude=set(ROUTING_FIELDS))
        data.update({k: _whole_numbers(None, v) for k, v in (self.model_extra or {}).items()})
        return data


class Candidate(BaseModel):
    host: str
    score: float | None = None
    reasons: list[dict[str, str]] | None = None
    error: str | None = None


class IsolationProblem(BaseModel):
    host: str
    guest: str
    thread: str
    cpus: list[int]
    owner: str | None = Field(description="the guest owning the pCPUs; null: reserved for the host")
    message: str


class NarrowedPins(BaseModel):
    guest: str
    host: str
    vcpupin: dict[str, list[int]]
    emulatorpin: list[int]


class PlacementView(BaseModel):
    model_config = ConfigDict(extra="allow")

    guest: str
    host: str
    state: PlacementState = Field(description="planned (dry run or reserved) | defined | running")
    dry_run: bool
    placement: dict[str, Any]
    xml: str
    domain_uuid: str | None = None
    narrowed: list[str] = Field(default_factory=list,
                                description="running domains whose shared vCPUs were narrowed")
    narrowed_pins: list[NarrowedPins] = Field(
        default_factory=list, description="each narrowed domain's vCPU and emulator pins now, as libvirt "
        "and the records have them")
    isolation_violations: list[IsolationProblem] = Field(
        default_factory=list, description="threads that still run on another guest's exclusive or the "
        "host's reserved pCPUs after this placement (a domain libvirt refused to narrow), each named")
    candidates: list[Candidate] = Field(default_factory=list)


class PlacementRecord(BaseModel):
    model_config = ConfigDict(extra="allow")

    guest: str
    host: str | None
    state: PlacementState
    domain_uuid: str | None = None
    spec: dict[str, Any]
    placement: dict[str, Any]
    claims: list[int]


class Page(BaseModel):
    """Where the next page of a list starts: null on the last page."""

    next_cursor: str | None = Field(default=None, description="pass as `cursor` (with the same filters) for the "
                                    "next page; null: this is the last page")
    next: str | None = Field(default=None, description="this request's path and query with `cursor` moved on (as "
                             "in the `Link: <...>; rel=\"next\"` header); null on the last page")


class PlacementList(Page):
    placements: list[PlacementRecord] = Field(description="newest first (by the record's id)")


class Removed(BaseModel):
    guest: str
    host: str | None
    undefined: bool = Field(description="this request destroyed and undefined the domain")
    domain: Literal["undefined", "gone", "kept"] = Field(
        description="undefined: by this request; gone: it was not defined any more; kept: left defined "
                    "(undefine=false, a reservation, or a host no longer configured)")


class Lease(BaseModel):
    holder: str = Field(description="the vmplacer instance acting on the host")
    acquired_at: ApiTime | None = None
    expires_at: ApiTime | None = None


class Maintenance(BaseModel):
    since: ApiTime = Field(description="when the host went into maintenance (ISO 8601 UTC)")
    by: str
    reason: str


class HostView(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    uri: str
    reachable: bool
    error: str | None = None
    lease: Lease | None = Field(default=None, description="held while a job acts on the host")
    maintenance: Maintenance | None = Field(default=None, description="set while the host takes no new guest "
                                            "and no migration")


class MaintenanceRequest(_Strict):
    reason: Reason = Field(min_length=1, description="why (kept with the host and in the audit log)")


class MaintenanceView(BaseModel):
    host: str
    changed: bool = Field(description="false: the host already was in that state")
    maintenance: Maintenance | None = Field(description="the host's maintenance record (after PUT: the current "
                                            "one; after DELETE: the one it had)")


class HostList(BaseModel):
    hosts: list[HostView]


ActionKind = Annotated[Literal[ACTION_KINDS], Named(  # type: ignore[valid-type]
    "ActionKind", "repin (new pCPUs on its host) | set_memory_nodes | migrate (live, to target_host) | probe "
                  "(a measurement) | throttle | release (a guest's CPU bandwidth down, or back up)")]
ActionState = Annotated[Literal[ACTION_STATES], Named(  # type: ignore[valid-type]
    "ActionState", "pending | running (not final); succeeded | failed | skipped | rolled_back (final)")]


def _no_default(schema: dict[str, Any]) -> None:
    """A field the server leaves out rather than sending a default: the document names none."""
    schema.pop("default", None)


class GuestCell(_Sent):
    """A guest NUMA cell and the host node it is on."""

    id: int
    vcpus: list[int]
    memory_kib: int
    host_node: int
    memory_node: int = Field(default=None, json_schema_extra=_no_default,  # type: ignore[assignment]
                             description="the host memory-only node holding its memory (present only when one does)")


class GuestPinning(_Sent):
    """Where a guest's vCPUs, emulator threads and memory are (before or after an action)."""

    guest: str
    host: str
    vcpupin: dict[str, list[int]] = Field(description="vCPU -> pCPUs")
    emulatorpin: list[int]
    memory_nodes: list[int]
    mem_mode: str
    cells: list[GuestCell]
    memory_kib: int
    hugepage_kib: int | None
    threads_per_core: int
    dedicated: bool
    exclusive_cpus: list[int]
    score: Number


class PlanAction(_Sent):
    """One change to one host, and how it went (`state`, `message`)."""

    index: int
    kind: ActionKind
    host: str = Field(description="where it runs (a migration's source)")
    guest: str | None
    target_host: str | None = Field(description="migrate: the host it goes to")
    before: GuestPinning | None = Field(description="null for probes and bandwidth changes")
    after: GuestPinning | None
    reason: str
    predicted_gain: Number = Field(description="the change of the plan's objective it brings")
    cost: dict[str, Number] = Field(description="what it costs (migration time and downtime, perf-seconds lost)")
    confidence: Number = Field(description="0..1: how much of the gain rests on observed data")
    depends_on: list[int] = Field(description="indexes of the actions that must succeed first")
    parameters: dict[str, Any] = Field(description="kind-specific (a bandwidth change: bandwidth_before, "
                                       "bandwidth_after)")
    state: ActionState
    message: str


JOB_STATUS_HELP = ("queued | running (not final); succeeded | failed | cancelled (final: `cancelled` = stopped by "
                   "POST /v1/jobs/{id}/cancel, before it started or between its steps)")
JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
JobStatus = Annotated[Literal[JOB_STATUSES],  # type: ignore[valid-type]
                      Named("JobStatus", "a job's state: " + JOB_STATUS_HELP)]
# The kinds of job the API queues (each named by the route module that runs it: profiles, protect, plans).
JOB_KINDS = ("profile", "protect", "plan", "apply-plan")
JOB_KIND_HELP = ("profile: Freeze'nSense on a host (POST /v1/profiles); protect: a protection loop (POST /v1/protect); "
                 "plan: a rebalancing dry run (POST /v1/plans?wait=); apply-plan: applying a plan "
                 "(POST /v1/plans/{id}/apply)")
JobKind = Annotated[Literal[JOB_KINDS],  # type: ignore[valid-type]
                    Named("JobKind", "what a job does: " + JOB_KIND_HELP)]
CancelOutcome = Annotated[Literal["cancelled", "cancel-requested"], Named(
    "CancelOutcome", "cancelled: stopped before it started, nothing of it runs; cancel-requested: it runs and stops "
    "between its steps (what is done stays done)")]


class JobResult(BaseModel):
    """What a job produced. Besides `empty`, each kind sends its own keys, typed here where a client
    acts on them (absent from the results of the other kinds); each kind sends more than these (a
    plan's diff and objective, a profile's overheads and settings), kept as further properties.

    - plan, apply-plan: the plan (as GET /v1/plans/{id} shows it): `plan_id`, `state`, `hosts`,
      `summary`, `predicted_gain`, `actions` (`PlanAction`s); a dry run's `notes`;
    - profile: `host`, `metric`, `run_id`, `stopped_because`, `freezes`, `pair_freezes`, `wall_s`,
      and per guest its distributions (`vms`);
    - protect: `host`, `rounds`, `released`; once stopped, `stopped_by` and `release_plan`."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": True})

    empty: bool = Field(description="true: the job ran but produced nothing (a profile that kept no sample, a "
                        "protection stopped before its first round); `empty_reason` says why")
    empty_reason: str | None = Field(default=None, description="why the job produced nothing (null unless empty)")
    # plan, apply-plan
    plan_id: int | None = Field(default=None, description="plan, apply-plan: the plan's id (as its `id`): "
                                "GET /v1/plans/{plan_id}")
    state: PlanState | None = Field(default=None, description="plan, apply-plan: the plan's state when the job "
                                    "ended")
    hosts: list[str] | None = Field(default=None, description="plan, apply-plan: the plan's hosts")
    summary: str | None = Field(default=None, description="plan, apply-plan: the plan in one line")
    predicted_gain: float | None = Field(default=None, description="plan, apply-plan: the gain the planner "
                                         "predicted")
    actions: list[PlanAction] | None = Field(default=None, description="plan, apply-plan: the plan's actions, "
                                             "each with its `state` (an applied plan: how each went)")
    notes: list[str] | None = Field(default=None, description="plan: what the dry run noted (hosts or guests "
                                    "left out, and why)")
    # profile, protect
    host: str | None = Field(default=None, description="profile, protect: the host it ran on")
    # profile
    metric: str | None = Field(default=None, description="profile: the performance metric sampled (ipc, cpu)")
    run_id: int | None = Field(default=None, description="profile: the stored run (GET /v1/profiles/{guest}"
                               "?run_id=)")
    stopped_because: str | None = Field(default=None, description="profile: why sampling ended (`samples "
                                        "reached`, `duration reached`, `stopped`: cancelled, …)")
    freezes: int | None = Field(default=None, ge=0, description="profile: neighbour freezes done")
    pair_freezes: int | None = Field(default=None, ge=0, description="profile: of which pair probes")
    wall_s: float | None = Field(default=None, ge=0, description="profile: seconds it sampled")
    vms: dict[str, dict[str, Any]] | None = Field(default=None, description="profile: per guest, its ζ, ζb and "
                                                  "degradation distributions")
    # protect
    rounds: int | None = Field(default=None, ge=0, description="protect: rounds the loop ran")
    released: list[str] | None = Field(default=None, description="protect: guests whose throttles the stop "
                                       "released")
    stopped_by: str | None = Field(default=None, description="protect: who stopped the loop")
    release_plan: dict[str, Any] | None = Field(default=None, description="protect: the plan that released the "
                                                "throttles (null: none was held)")

    @model_serializer(mode="wrap")
    def _as_sent(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """Only the keys the job's kind sends: another kind's typed fields are left out, not null.
        (No return annotation: one would replace this model's schema in the document.)"""
        data = handler(self)
        return {key: value for key, value in data.items()
                if key in self.model_fields_set or key in _ALWAYS_IN_RESULT or key not in type(self).model_fields}


_ALWAYS_IN_RESULT = frozenset({"empty", "empty_reason"})


class JobError(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": True})

    code: str = Field(description="machine-readable kind: cancelled, interrupted, abandoned, host-unavailable, "
                      "invalid, conflict, internal, or an applied plan's final state")
    message: str
    details: Any = None


class JobView(BaseModel):
    id: str
    kind: JobKind = Field(description=JOB_KIND_HELP)
    hosts: list[str]
    status: JobStatus = Field(description=JOB_STATUS_HELP)
    progress: float
    message: str
    parameters: dict[str, Any] = Field(description="what the job was asked to do; `stop` (a job cancelled or asked "
                                       "to stop): {by, at (ISO 8601 UTC)}")
    result: JobResult | None = Field(default=None, description="what it produced (a cancelled job: what it had "
                                     "produced so far)")
    error: JobError | None = None
    created_by: str
    owner: str | None = None
    created_at: ApiTime
    started_at: ApiTime | None = None
    finished_at: ApiTime | None = None


class JobList(Page):
    jobs: list[JobView] = Field(description="newest first (by creation time, then id)")


class JobAccepted(BaseModel):
    job: JobView
    location: str


class JobCancelView(BaseModel):
    status: CancelOutcome = Field(
        description="cancelled: the job had not started and never will; cancel-requested: it runs and stops "
                    "between its steps (poll `location`)")
    job: JobView
    location: str = Field(description="where to follow the job")


class ProfileRequest(_Strict):
    host: HostName | None = Field(default=None, description="a configured host (another name: 422 naming `host`); "
                                  "default: the first configured host")
    vms: list[DomainName] = Field(default_factory=list, max_length=256,
                           description="sensitive VMs (sampled with neighbours frozen); empty: all running")
    sensitive: SelectorText = Field(default="all",
                           description="all, label:KEY=VALUE or class:NAME (e.g. class:latency-critical)")
    # a microsecond at least: below it the window rounds to nothing in seconds
    t_m_ms: float | None = Field(default=None, ge=0.001, le=10_000)
    t_sleep_s: float | None = Field(default=None, ge=0, le=86_400)
    max_freeze_ms: float | None = Field(default=None, ge=0.001, le=60_000)
    samples: int | None = Field(default=None, ge=1, le=100_000)
    duration_s: float | None = Field(default=None, gt=0, le=86_400)
    metric: Literal["auto", "ipc", "cpu"] | None = None
    exclude: list[Glob] = Field(default_factory=list, max_length=256, description="never frozen (glob patterns)")
    scope: list[Glob] = Field(default_factory=list, max_length=256, description="domains considered (globs)")
    adaptive: bool = False
    pair_probes: int | None = Field(default=None, ge=0, le=1000,
                                    description="pair probes per round (all but a VM and one neighbour frozen); "
                                                "default: profiler.pair_probes, 0: none")

    _whole_numbers = field_validator("samples", "pair_probes", mode="before")(_whole_numbers)


class ProtectRequest(_Strict):
    host: HostName | None = Field(default=None, description="a configured host (another name: 422 naming `host`); "
                                  "default: the first configured host")
    scope: list[Glob] = Field(default_factory=list, max_length=256,
                              description="only guests whose names match are read, frozen and throttled (globs)")
    samples: int = Field(default=5, ge=1, le=100, description="ζ and ζb samples per protected guest per fast round")
    t_m_ms: float | None = Field(default=None, ge=0.1, le=1000, description="Freeze'nSense window")

    _whole_numbers = field_validator("samples", mode="before")(_whole_numbers)


class ProtectedGuest(_Sent):
    """A protected guest as the loop's last recorded round saw it (null: not recorded)."""

    guest: str
    ratio: Number | None = Field(description="ζ/ζb smoothed: the share of its solo performance it gets")
    ratio_raw: Number | None = Field(description="the last round's ζ/ζb, unsmoothed")
    floor: Number | None = Field(description="the ratio it is protected at")
    state: str | None = Field(description="what the loop judged: below | held | headroom | unmeasured | "
                              "cannot-hold | idle (as its recorded round has it)")
    throttles_applied: int | None = Field(description="throttles applied for it since the loop started")
    below_floor_s: Number | None = Field(description="seconds it spent below its floor since the loop started")


class ProtectThrottle(_Sent):
    """A throttle vmplacer set on the host and has not released."""

    guest: str
    share: Number = Field(description="the CPU share it is held at")
    original_share: Number = Field(description="its share before vmplacer first throttled it")
    protects: str = Field(description="the protected guest it serves")
    plan_id: int | None = Field(description="the stored plan that set it")
    age_s: Number = Field(description="seconds since it last changed")


class ProtectView(BaseModel):
    model_config = ConfigDict(extra="allow")

    job: JobView
    host: str
    last_round_at: ApiTime | None = Field(default=None, description="the loop's last recorded round (null: none yet)")
    guests: list[ProtectedGuest]
    throttles: list[ProtectThrottle]


class Distribution(BaseModel):
    model_config = ConfigDict(extra="allow")

    n: int
    mean: float
    p50: float


class VmProfile(BaseModel):
    model_config = ConfigDict(extra="allow")

    zeta: dict[str, Any] | None
    zeta_b: dict[str, Any] | None
    degradation: dict[str, Any] | None
    neighbours: list[dict[str, Any]]
    pairs: list[dict[str, Any]] = Field(default_factory=list,
                                        description="per neighbour a pair probe ran the guest with alone: "
                                                    "neighbour, distance, n, degradation; costliest first")


class ProfileRun(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int
    host: str
    metric: str | None = None
    status: Literal["running", "finished", "failed", "interrupted"] = Field(
        description="running (also a run whose process ended mid-way) | finished | failed | interrupted")
    started_at: ApiTime | None = None
    finished_at: ApiTime | None = None
    parameters: dict[str, Any] | None = None


class ProfileView(BaseModel):
    guest: str
    run: ProfileRun
    profile: VmProfile


class AuditEntry(BaseModel):
    id: int
    at: ApiTime | None
    actor: str
    action: str
    host: str | None
    guest: str | None
    outcome: str
    message: str
    detail: dict[str, Any]


class AuditList(Page):
    entries: list[AuditEntry] = Field(description="newest first (by id)")


class Health(BaseModel):
    status: Literal["ok"]


class ReadyCheck(BaseModel):
    name: str
    ok: bool
    detail: str = ""


class Readiness(BaseModel):
    ready: bool
    checks: list[ReadyCheck]


class PlanRequest(_Strict):
    hosts: list[HostName] | None = Field(default=None, max_length=256,
                                         description="configured hosts to rebalance (another name: 422 naming "
                                                     "`hosts`; default: every configured host)")
    max_actions: int | None = Field(default=None, ge=0, le=1000)
    scope: list[Glob] = Field(default_factory=list, max_length=256,
                              description="glob patterns of guests that may move (default: all)")
    drain: str | None = Field(default=None, pattern=HOST_NAME, max_length=63,
                              description="a host in maintenance to empty: the plan live-migrates its guests "
                                          "away instead of rebalancing")

    _whole_numbers = field_validator("max_actions", mode="before")(_whole_numbers)


class ReconcileRequest(_Strict):
    hosts: list[HostName] | None = Field(default=None, max_length=256,
                                         description="hosts to reconcile (default: every configured host)")
    dry_run: bool = Field(default=False, description="report what would change; write nothing")
    reservation_grace_s: float = Field(default=3600.0, ge=0, le=30 * 86400,
                                       description="how long a reservation (define=false) waits for its domain")
    settle_s: float = Field(default=60.0, ge=0, le=86400,
                            description="records changed this recently are never written to")


FindingKind = Annotated[Literal[FINDING_KINDS], Named(  # type: ignore[valid-type]
    "FindingKind", "how a record and libvirt disagree (docs/operations.md, Reconcile, lists every kind)")]
ReconcileAction = Annotated[Literal[RECONCILE_ACTIONS], Named(  # type: ignore[valid-type]
    "ReconcileAction", "what reconciling does about a finding: release the record, follow the domain to its "
                       "host, set the recorded state, restore or adopt drifted pins, or none (reported only)")]


class ReconcileFinding(_Sent):
    """One record that disagrees with libvirt (or a domain without one), and what became of it."""

    guest: str
    host: str
    kind: FindingKind
    action: ReconcileAction
    detail: str
    recorded_state: PlacementState | None
    live_state: str | None = Field(description="the domain's state as libvirt reports it (running, paused, "
                                   "shutoff, ...)")
    state: PlacementState | None = Field(description="the state a set_state writes")
    domain_uuid: str | None
    age_s: Number | None = Field(description="seconds since the record last changed")
    deferred: str | None = Field(description="settling: the kind it is judged as once the record has settled")
    target_host: str | None = Field(description="moved: the host the domain runs on now")
    outcome: str = Field(description="applied, would-apply (dry run), reported, skipped or failed")
    outcome_message: str


class ThrottleFinding(_Sent):
    """A throttle the ledger and the host disagree on (reported, never acted on by reconcile)."""

    host: str
    guest: str
    kind: Literal[THROTTLE_FINDINGS]  # type: ignore[valid-type]
    detail: str


class ReconciledHost(_Sent):
    """One host's part of a reconcile run."""

    host: str
    status: Literal["reconciled", "busy", "unreachable"] = Field(
        description="reconciled | busy (another run holds its lease) | unreachable: nothing of it was changed")
    message: str
    counts: dict[str, int] = Field(description="findings per kind (kinds without findings left out)")
    findings: list[ReconcileFinding]
    throttles: list[ThrottleFinding]


class ReconcileView(BaseModel):
    model_config = ConfigDict(extra="allow")

    status: Literal["complete", "incomplete"] = Field(
        description="complete | incomplete (a host was busy or unreachable: see problems)")
    dry_run: bool
    released: int
    updated: int
    hosts: list[ReconciledHost]
    problems: list[str]


class HostError(BaseModel):
    host: str
    error: str
    kind: Literal["unreadable", "refused"] = Field(
        default="unreadable", description="unreadable: libvirt or the host's topology could not be read; refused: "
                                          "the planner refused the host's guests (one pinned to pCPUs the host's "
                                          "capabilities do not list: `settings.refused` names them)")


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    by: str
    reason: str = ""
    at: ApiTime | None = None


class GuestDiff(_Sent):
    """One guest a plan moves, before the plan and after all of it (a trial's moves count only once
    kept): what `vmplacer rebalance` prints as the plan's diff."""

    guest: str
    host_before: str
    host_after: str
    pins_before: str = Field(description="its pinning as text, e.g. `0→2 1→3 emu→0-1 mem→0`; `(unpinned)`: none")
    pins_after: str
    perf_before: Number | None = Field(description="its predicted performance before the plan (1: as fast as "
                                       "alone); null: not predicted")
    perf_after: Number | None = Field(description="its predicted performance after the plan")


class PlanView(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int | None
    state: PlanState = Field(description=PLAN_STATE_HELP)
    hosts: list[str]
    predicted_gain: float
    summary: str
    actions: list[PlanAction]
    diff: list[GuestDiff] = Field(description="per guest the plan moves: where it is and how it is pinned before "
                                  "the plan and after it")
    created_at: ApiTime | None = None
    cancel_request: CancelRequest | None = Field(
        default=None, description="a running plan someone asked to stop: it stops before its next action")
    errors: list[HostError] = Field(default_factory=list,
                                    description="hosts left out of the plan when it was made (not read, or refused "
                                                "by the planner): their guests were not considered")


class PlanSummary(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int
    state: PlanState = Field(description=PLAN_STATE_HELP)
    hosts: list[str]
    summary: str
    actions: int
    created_at: ApiTime | None = None


class PlanList(Page):
    plans: list[PlanSummary] = Field(description="newest first (by id)")


class PlanCancelRequest(_Strict):
    reason: Reason = Field(default="", description="why; kept with the plan and in the audit log")


class PlanCancelView(BaseModel):
    status: CancelOutcome = Field(
        description="cancelled: the plan had not started, its actions are skipped; cancel-requested: the plan "
                    "is running and stops before its next action (actions already done stay applied)")
    plan: PlanView
