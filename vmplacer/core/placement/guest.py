"""What a guest asks for: vCPUs, memory, CPU/thread/NUMA/memory policies, labels.

One validated value, built from a plain mapping (a request file, an API body)
or from OpenStack flavor extra specs, so an orchestrator can pass Nova's
`hw:*` names through unchanged. Validation collects *every* problem before
failing, each as (guest, field, reason), so one run shows the whole list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vmplacer.core.topology.cpuset import CpusetError, format_cpuset, parse_cpuset
from vmplacer.core.placement.guest_placement import MEM_MODES
from vmplacer.core.protect.policy import PROTECTION_EXTRA_SPECS, label_problems
from vmplacer.core.text import control_problem

CPU_POLICIES = ("shared", "dedicated", "mixed")
THREAD_POLICIES = ("prefer", "isolate", "require")
EMULATOR_POLICIES = ("share", "isolate")
WORKLOAD_CLASSES = ("latency-critical", "batch", "unknown")
# A flavor's workload class: the label admission's class priors are keyed by (docs/placement.md).
CLASS_EXTRA_SPEC = "vmplacer:workload_class"
CLASS_LABEL = "workload_class"
CLASS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
PAGE_SIZE_WORDS = ("small", "large", "any")

MAX_VCPUS = 1024
MAX_MEMORY_MIB = 16 * 1024 * 1024  # 16 TiB
MAX_NUMA_NODES = 64
MAX_HOST_NODE = 1023  # Linux numbers NUMA nodes below MAX_NUMNODES (at most 1024)
SMALL_PAGE_KIB = 4

# libvirt-safe names: no XML or shell metacharacters, no path separators.
NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}$")
MAX_LABEL_VALUE = 256
PRIORITY_RANGE = (-1000, 1000)

FIELDS = (
    "name", "vcpus", "memory_mib", "cpu_policy", "thread_policy", "dedicated_vcpus",
    "numa_nodes", "numa_cpus", "numa_mem", "mem_mode", "mem_page_size", "emulator_threads",
    "workload_class", "labels", "affinity", "anti_affinity", "extra_specs", "memory_node",
)

# OpenStack flavor extra spec -> native field. numa_cpus.N / numa_mem.N handled apart.
EXTRA_SPEC_FIELDS = {
    "hw:cpu_policy": "cpu_policy",
    "hw:cpu_thread_policy": "thread_policy",
    "hw:numa_nodes": "numa_nodes",
    "hw:mem_page_size": "mem_page_size",
    "hw:emulator_threads_policy": "emulator_threads",
    "hw:cpu_dedicated_mask": "dedicated_vcpus",
}
_INDEXED_EXTRA_SPEC = re.compile(r"^hw:(numa_cpus|numa_mem)\.(\d+)$")
_INDEXED_FIELD = re.compile(r"^(numa_cpus|numa_mem|memory_node)\.(\d+)$")
_PER_CELL_FIELDS = ("numa_cpus", "numa_mem", "memory_node")
_SIZE_RE = re.compile(r"^(\d+)\s*([KMGT]?)(?:I?B)?$", re.IGNORECASE)
_SIZE_UNITS_KIB = {"": 1, "K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}


@dataclass(frozen=True)
class Problem:
    guest: str
    field: str
    reason: str

    def __str__(self) -> str:
        return f"guest {self.guest}: field {self.field}: {self.reason}"


class GuestSpecError(ValueError):
    """Every problem found in one guest spec; `problems` keeps them structured."""

    def __init__(self, problems: list[Problem]):
        self.problems = tuple(problems)
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class GuestCellSpec:
    """One guest NUMA cell the caller asked for explicitly (numa_cpus.N / numa_mem.N)."""

    id: int
    vcpus: frozenset[int]
    memory_mib: int


@dataclass(frozen=True)
class GuestSpec:
    """A validated guest request. Build it with `GuestSpec.from_mapping`."""

    name: str
    vcpus: int
    memory_mib: int
    cpu_policy: str = "shared"
    thread_policy: str = "prefer"
    dedicated_vcpus: frozenset[int] = frozenset()  # cpu_policy=mixed only
    numa_nodes: int | None = None  # None: one node when it fits, else the fewest that do
    numa_cells: tuple[GuestCellSpec, ...] = ()  # explicit numa_cpus/numa_mem, else empty
    mem_mode: str = "strict"
    mem_page_size: str | int = "small"  # "small" | "large" | "any" | page size in KiB
    emulator_threads: str = "share"
    workload_class: str = "unknown"
    labels: dict[str, str] = field(default_factory=dict)
    affinity: tuple[str, ...] = ()
    anti_affinity: tuple[str, ...] = ()
    # Host memory-only (CPU-less) node holding guest memory: one for every cell, or per cell.
    memory_node: int | None = None
    cell_memory_nodes: dict[int, int] = field(default_factory=dict)

    # ----- effective policy (what the allocator actually does) ---------------------------
    @property
    def latency_critical(self) -> bool:
        return self.workload_class == "latency-critical"

    @property
    def dedicated_vcpu_set(self) -> frozenset[int]:
        """vCPUs that get a pCPU of their own.

        A latency-critical guest is treated as dedicated even under
        cpu_policy=shared: a floating vCPU cannot be kept away from co-runners.
        """
        if self.cpu_policy == "dedicated" or self.latency_critical:
            return frozenset(range(self.vcpus))
        if self.cpu_policy == "mixed":
            return self.dedicated_vcpus
        return frozenset()

    @property
    def effective_thread_policy(self) -> str:
        """latency-critical always means isolate: whole cores, idle siblings."""
        return "isolate" if self.latency_critical else self.thread_policy

    @property
    def page_size_kib(self) -> int | None:
        """The explicit page size asked for, or None for small/large/any."""
        return self.mem_page_size if isinstance(self.mem_page_size, int) else None

    def memory_node_of(self, cell: int) -> int | None:
        """The memory-only host node named for guest cell `cell`, or None (memory stays with its vCPUs)."""
        return self.cell_memory_nodes.get(cell, self.memory_node)

    @property
    def priority(self) -> int:
        return int(self.labels.get("priority", "0"))

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "vcpus": self.vcpus,
            "memory_mib": self.memory_mib,
            "cpu_policy": self.cpu_policy,
            "thread_policy": self.thread_policy,
            "mem_mode": self.mem_mode,
            "mem_page_size": self.mem_page_size,
            "emulator_threads": self.emulator_threads,
            "workload_class": self.workload_class,
            "labels": dict(self.labels),
            "affinity": list(self.affinity),
            "anti_affinity": list(self.anti_affinity),
        }
        if self.cpu_policy == "mixed":
            data["dedicated_vcpus"] = format_cpuset(self.dedicated_vcpus)
        if self.numa_nodes is not None:
            data["numa_nodes"] = self.numa_nodes
        if self.numa_cells:
            data["numa_cpus"] = {str(c.id): format_cpuset(c.vcpus) for c in self.numa_cells}
            data["numa_mem"] = {str(c.id): c.memory_mib for c in self.numa_cells}
        if self.memory_node is not None:
            data["memory_node"] = self.memory_node
        elif self.cell_memory_nodes:
            data["memory_node"] = {str(c): n for c, n in sorted(self.cell_memory_nodes.items())}
        return data

    @classmethod
    def from_mapping(cls, data: Any) -> GuestSpec:
        """Validate a plain mapping; raise GuestSpecError listing every problem."""
        return _Validator(data).build()


def parse_page_size(value: Any) -> str | int:
    """'small' | 'large' | 'any' | a size ('2MB', '1GB', 2048 = KiB, Nova's unit) -> word or KiB.

    Raises ValueError with the reason when the value is not a page size.
    """
    if isinstance(value, bool):
        raise ValueError(f"must be small, large, any or a page size like 2MB/1GB/2048, got {value!r}")
    if isinstance(value, int):
        kib = value
    elif isinstance(value, str):
        text = value.strip()
        if text.lower() in PAGE_SIZE_WORDS:
            return text.lower()
        match = _SIZE_RE.match(text)
        if not match:
            raise ValueError(
                f"must be small, large, any or a page size like 2MB/1GB/2048, got {value!r}"
            )
        kib = int(match.group(1)) * _SIZE_UNITS_KIB[match.group(2).upper()]
    else:
        raise ValueError(f"must be small, large, any or a page size like 2MB/1GB/2048, got {value!r}")
    if kib < SMALL_PAGE_KIB or kib & (kib - 1):
        raise ValueError(f"page size must be a power of two of at least 4 KiB, got {value!r}")
    return "small" if kib == SMALL_PAGE_KIB else kib


def page_size_text(value: str | int) -> str:
    """Human form of a page size value: 'small', '2048KiB'…"""
    return value if isinstance(value, str) else f"{value}KiB"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Validator:
    """Collects problems field by field; `build` raises them all at once."""

    def __init__(self, data: Any):
        self.data = data
        self.problems: list[Problem] = []
        self.spec_labels: dict[str, tuple[str, str]] = {}  # label -> (extra spec name, value)
        self.spec_class: str | None = None  # from vmplacer:workload_class
        raw_name = data.get("name") if isinstance(data, Mapping) else None
        self.label = raw_name if isinstance(raw_name, str) and NAME_RE.match(raw_name) else (
            repr(raw_name) if raw_name is not None else "<unnamed>"
        )

    def fail(self, field_name: str, reason: str) -> None:
        self.problems.append(Problem(self.label, field_name, reason))

    # ----- entry point -----------------------------------------------------------------
    def build(self) -> GuestSpec:
        data = self.data
        if not isinstance(data, Mapping):
            raise GuestSpecError([Problem(self.label, "<guest>", f"must be a mapping, got {type(data).__name__}")])
        values, indexed = self._split_fields(data)
        self._merge_extra_specs(data.get("extra_specs"), values, indexed)

        name = self._name(values.get("name"))
        vcpus = self._int(values, "vcpus", 1, MAX_VCPUS, required=True)
        memory_mib = self._int(values, "memory_mib", 1, MAX_MEMORY_MIB, required=True)
        cpu_policy = self._choice(values, "cpu_policy", CPU_POLICIES, "shared")
        thread_policy = self._choice(values, "thread_policy", THREAD_POLICIES, "prefer")
        mem_mode = self._choice(values, "mem_mode", MEM_MODES, "strict")
        emulator = self._choice(values, "emulator_threads", EMULATOR_POLICIES, "share")
        workload = self._choice(values, "workload_class", WORKLOAD_CLASSES, "unknown")
        page_size = self._page_size(values)
        labels = self._protection_labels(self._labels(values.get("labels")))
        affinity = self._names(values, "affinity", name)
        anti = self._names(values, "anti_affinity", name)
        both = sorted(set(affinity) & set(anti))
        if both:
            self.fail("anti_affinity", f"guests {', '.join(both)} are also listed in affinity")
        dedicated = self._dedicated_mask(values, cpu_policy, vcpus)
        numa_nodes, cells = self._numa(values, indexed, vcpus, memory_mib)
        memory_node, cell_memory_nodes = self._memory_nodes(values, indexed["memory_node"], numa_nodes, cells)
        self._policy_conflicts(values, cpu_policy, thread_policy, emulator, workload)

        if self.problems:
            raise GuestSpecError(self.problems)
        assert name is not None and vcpus is not None and memory_mib is not None
        return GuestSpec(
            name=name, vcpus=vcpus, memory_mib=memory_mib, cpu_policy=cpu_policy,
            thread_policy=thread_policy, dedicated_vcpus=dedicated, numa_nodes=numa_nodes,
            numa_cells=cells, mem_mode=mem_mode, mem_page_size=page_size,
            emulator_threads=emulator, workload_class=workload, labels=labels,
            affinity=affinity, anti_affinity=anti, memory_node=memory_node,
            cell_memory_nodes=cell_memory_nodes,
        )

    # ----- field collection -----------------------------------------------------------------
    def _split_fields(self, data: Mapping[Any, Any]) -> tuple[dict[str, Any], dict[str, dict[int, Any]]]:
        """Native fields, plus per-cell fields given as mappings or flat `numa_cpus.N` keys.

        `memory_node` is per cell as a mapping or flat keys, for the whole guest as one value.
        """
        values: dict[str, Any] = {}
        indexed: dict[str, dict[int, Any]] = {key: {} for key in _PER_CELL_FIELDS}
        for key, value in data.items():
            if not isinstance(key, str):
                self.fail(str(key), "field names must be strings")
                continue
            flat = _INDEXED_FIELD.match(key)
            if flat:
                indexed[flat.group(1)][int(flat.group(2))] = value
            elif key in _PER_CELL_FIELDS and (key != "memory_node" or isinstance(value, Mapping)):
                if not isinstance(value, Mapping):
                    self.fail(key, f"must be a mapping of cell number to value, got {value!r}")
                    continue
                for cell, item in value.items():
                    if _is_int(cell) or (isinstance(cell, str) and cell.isdigit()):
                        indexed[key][int(cell)] = item
                    else:
                        self.fail(f"{key}.{cell}", "cell numbers must be integers 0..N-1")
            elif key == "extra_specs":
                continue
            elif key in FIELDS:
                values[key] = value
            else:
                self.fail(key, f"unknown field (allowed: {', '.join(FIELDS)}, numa_cpus.N, numa_mem.N, "
                               "memory_node.N)")
        return values, indexed

    def _merge_extra_specs(self, specs: Any, values: dict[str, Any], indexed: dict[str, dict[int, Any]]) -> None:
        """Fold `hw:*` specs into native fields; a disagreement with a native field is an error.

        Keys outside the `hw:` namespace (quota:, trait:, resources:…) concern other
        services and are ignored; an unknown `hw:` key is rejected, so a typo never
        silently drops a pinning request.
        """
        if specs is None:
            return
        if not isinstance(specs, Mapping):
            self.fail("extra_specs", f"must be a mapping of 'hw:…' names to values, got {type(specs).__name__}")
            return
        for key, raw in specs.items():
            where = f"extra_specs.{key}"
            if not isinstance(key, str) or ":" not in key:
                self.fail(where, "extra spec names look like 'namespace:name'")
                continue
            if key == CLASS_EXTRA_SPEC:
                self._class_spec(raw, where, values)
                continue
            if key.startswith("vmplacer:"):
                self._protection_spec(key, raw, where)
                continue
            if not key.startswith("hw:"):
                continue
            value = self._extra_spec_value(raw, where, key)
            if value is None:
                continue
            indexed_match = _INDEXED_EXTRA_SPEC.match(key)
            if indexed_match:
                target, cell = indexed_match.group(1), int(indexed_match.group(2))
                existing = indexed[target].get(cell)
                if existing is not None and not _same_value(existing, value):
                    self.fail(where, f"conflicts with {target}.{cell}={existing!r}")
                else:
                    indexed[target][cell] = value
                continue
            native = EXTRA_SPEC_FIELDS.get(key)
            if native is None:
                supported = ", ".join(sorted([*EXTRA_SPEC_FIELDS, "hw:numa_cpus.N", "hw:numa_mem.N"]))
                self.fail(where, f"not supported by vmplacer (supported: {supported})")
                continue
            if native in values and not _same_value(values[native], value, native):
                self.fail(where, f"conflicts with {native}={values[native]!r}")
                continue
            values[native] = value

    def _class_spec(self, raw: Any, where: str, values: dict[str, Any]) -> None:
        """`vmplacer:workload_class` becomes the `workload_class` label, the class whose profiled
        guests teach admission about a new one (a flavor names it once for every guest it
        launches); one of the native classes also sets the `workload_class` field."""
        if isinstance(raw, bool) or not isinstance(raw, str) or not CLASS_RE.match(raw.strip()):
            self.fail(where, f"must be a class name of 1-63 characters of A-Z a-z 0-9 _ . - starting with a "
                             f"letter or digit, got {raw!r}")
            return
        value = raw.strip()
        if value in WORKLOAD_CLASSES and value != "unknown":
            native = values.get("workload_class")
            if native is not None and native != value:
                self.fail(where, f"conflicts with workload_class={native!r}")
                return
            values["workload_class"] = value
        self.spec_class = value

    def _protection_spec(self, key: str, raw: Any, where: str) -> None:
        """`vmplacer:protect` / `vmplacer:min_cpu_share` become labels; other `vmplacer:` names are typos."""
        label = PROTECTION_EXTRA_SPECS.get(key)
        if label is None:
            supported = ", ".join(sorted([*PROTECTION_EXTRA_SPECS, CLASS_EXTRA_SPEC]))
            self.fail(where, f"not supported by vmplacer (supported: {supported})")
            return
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            self.fail(where, f"must be a number, got {raw!r}")
            return
        self.spec_labels[label] = (key, str(raw).strip())

    def _protection_labels(self, labels: dict[str, str]) -> dict[str, str]:
        """Fold protection and class extra specs into the labels and check the protection values."""
        if self.spec_class is not None:
            given = labels.get(CLASS_LABEL)
            if given is not None and given != self.spec_class:
                self.fail(f"extra_specs.{CLASS_EXTRA_SPEC}", f"conflicts with labels.{CLASS_LABEL}={given!r}")
            else:
                labels[CLASS_LABEL] = self.spec_class
        for label, (key, value) in self.spec_labels.items():
            if label in labels and not _same_number(labels[label], value):
                self.fail(f"extra_specs.{key}", f"conflicts with labels.{label}={labels[label]!r}")
                continue
            labels[label] = labels.get(label, value)
        for label, reason in label_problems(labels):
            where = f"extra_specs.{self.spec_labels[label][0]}" if label in self.spec_labels else f"labels.{label}"
            self.fail(where, reason)
        return labels

    def _extra_spec_value(self, raw: Any, where: str, key: str) -> Any:
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            self.fail(where, f"must be a string, got {raw!r}")
            return None
        if key in ("hw:numa_nodes",) or key.startswith("hw:numa_mem."):
            text = str(raw).strip()
            if not text.isdigit():
                self.fail(where, f"must be an integer, got {raw!r}")
                return None
            return int(text)
        return raw.strip() if isinstance(raw, str) else raw

    # ----- scalar fields -------------------------------------------------------------------
    def _name(self, value: Any) -> str | None:
        if value is None:
            self.fail("name", "is required")
            return None
        if not isinstance(value, str) or not NAME_RE.match(value):
            self.fail("name", f"must be 1-64 characters of A-Z a-z 0-9 _ . + -, got {value!r}")
            return None
        if value.startswith("-") or set(value) == {"."}:
            self.fail("name", f"must not start with '-' or be only dots, got {value!r}")
            return None
        return value

    def _int(self, values: dict[str, Any], key: str, low: int, high: int, required: bool = False) -> int | None:
        if key not in values or values[key] is None:
            if required:
                self.fail(key, "is required")
            return None
        value = values[key]
        if not _is_int(value) or not low <= value <= high:
            self.fail(key, f"must be an integer {low}..{high}, got {value!r}")
            return None
        return int(value)

    def _choice(self, values: dict[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
        value = values.get(key)
        if value is None:
            return default
        if value not in allowed:
            self.fail(key, f"must be one of {', '.join(allowed)}, got {value!r}")
            return default
        return str(value)

    def _page_size(self, values: dict[str, Any]) -> str | int:
        value = values.get("mem_page_size")
        if value is None:
            return "small"
        try:
            return parse_page_size(value)
        except ValueError as exc:
            self.fail("mem_page_size", str(exc))
            return "small"

    def _labels(self, value: Any) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail("labels", f"must be a mapping of names to values, got {type(value).__name__}")
            return {}
        labels: dict[str, str] = {}
        for key, raw in value.items():
            where = f"labels.{key}"
            if not isinstance(key, str) or not LABEL_KEY_RE.match(key):
                self.fail(where, f"label names are 1-63 characters of A-Z a-z 0-9 _ . / - starting with a letter or digit, got {key!r}")
                continue
            if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
                self.fail(where, f"must be a string or a number, got {raw!r}")
                continue
            text = str(raw)
            if len(text) > MAX_LABEL_VALUE:
                self.fail(where, f"must be at most {MAX_LABEL_VALUE} characters, got {len(text)}")
                continue
            problem = control_problem(text)
            if problem is not None:
                self.fail(where, problem)
                continue
            if key == "priority":
                try:
                    priority = int(text)
                except ValueError:
                    priority = None
                if priority is None or not PRIORITY_RANGE[0] <= priority <= PRIORITY_RANGE[1]:
                    self.fail(where, f"must be an integer {PRIORITY_RANGE[0]}..{PRIORITY_RANGE[1]}, got {raw!r}")
                    continue
                text = str(priority)
            labels[key] = text
        return labels

    def _names(self, values: dict[str, Any], key: str, own: str | None) -> tuple[str, ...]:
        value = values.get(key)
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            self.fail(key, f"must be a list of guest names, got {value!r}")
            return ()
        result: list[str] = []
        for item in value:
            if not isinstance(item, str) or not NAME_RE.match(item):
                self.fail(key, f"{item!r} is not a valid guest name")
            elif item == own:
                self.fail(key, "a guest cannot name itself")
            elif item not in result:
                result.append(item)
        return tuple(result)

    # ----- structured fields ------------------------------------------------------------------
    def _cpu_list(self, raw: Any, where: str) -> frozenset[int] | None:
        if isinstance(raw, (list, tuple)) and all(_is_int(x) and x >= 0 for x in raw):
            return frozenset(raw)
        if _is_int(raw) and raw >= 0:
            return frozenset({raw})
        if isinstance(raw, str):
            try:
                return parse_cpuset(raw)
            except CpusetError as exc:
                self.fail(where, str(exc))
                return None
        self.fail(where, f"must be a CPU list like '0-3,6' or a list of integers, got {raw!r}")
        return None

    def _dedicated_mask(self, values: dict[str, Any], cpu_policy: str, vcpus: int | None) -> frozenset[int]:
        raw = values.get("dedicated_vcpus")
        if raw is None:
            if cpu_policy == "mixed":
                self.fail("dedicated_vcpus", "is required with cpu_policy mixed (which vCPUs are dedicated, e.g. '0-1' or '^0')")
            return frozenset()
        if cpu_policy != "mixed":
            self.fail("dedicated_vcpus", f"only applies to cpu_policy mixed, not {cpu_policy}")
            return frozenset()
        if vcpus is None:
            return frozenset()
        # Nova's hw:cpu_dedicated_mask: '^0-1' = every vCPU except 0-1.
        negate = isinstance(raw, str) and raw.strip().startswith("^") and "," not in raw
        mask = self._cpu_list(raw.strip()[1:] if negate else raw, "dedicated_vcpus")
        if mask is None:
            return frozenset()
        outside = sorted(v for v in mask if v >= vcpus)
        if outside:
            self.fail("dedicated_vcpus", f"vCPUs {format_cpuset(outside)} do not exist (guest has {vcpus}: 0-{vcpus - 1})")
            return frozenset()
        if negate:
            mask = frozenset(range(vcpus)) - mask
        if not mask or len(mask) == vcpus:
            self.fail("dedicated_vcpus", f"mixed needs some dedicated and some shared vCPUs, got {format_cpuset(mask) or 'none'} of {vcpus}")
            return frozenset()
        return mask

    def _numa(self, values: dict[str, Any], indexed: dict[str, dict[int, Any]], vcpus: int | None,
              memory_mib: int | None) -> tuple[int | None, tuple[GuestCellSpec, ...]]:
        numa_nodes = self._int(values, "numa_nodes", 1, MAX_NUMA_NODES)
        cpus_raw, mem_raw = indexed["numa_cpus"], indexed["numa_mem"]
        if numa_nodes is not None and vcpus is not None and numa_nodes > vcpus:
            self.fail("numa_nodes", f"{numa_nodes} cells cannot each hold a vCPU of {vcpus}")
            return None, ()
        if not cpus_raw and not mem_raw:
            return numa_nodes, ()
        if set(cpus_raw) != set(mem_raw):
            missing_mem = sorted(set(cpus_raw) - set(mem_raw))
            missing_cpus = sorted(set(mem_raw) - set(cpus_raw))
            if missing_mem:
                self.fail("numa_mem", f"cells {missing_mem} have numa_cpus but no numa_mem")
            if missing_cpus:
                self.fail("numa_cpus", f"cells {missing_cpus} have numa_mem but no numa_cpus")
            return numa_nodes, ()
        count = numa_nodes if numa_nodes is not None else len(cpus_raw)
        if sorted(cpus_raw) != list(range(count)):
            self.fail("numa_cpus", f"cells must be numbered 0..{count - 1} (numa_nodes={count}), got {sorted(cpus_raw)}")
            return numa_nodes, ()
        cells: list[GuestCellSpec] = []
        seen: set[int] = set()
        for cell in range(count):
            cpus = self._cpu_list(cpus_raw[cell], f"numa_cpus.{cell}")
            mem = mem_raw[cell]
            if not _is_int(mem) or mem < 1:
                self.fail(f"numa_mem.{cell}", f"must be a positive integer (MiB), got {mem!r}")
                continue
            if cpus is None:
                continue
            if not cpus:
                self.fail(f"numa_cpus.{cell}", "a cell needs at least one vCPU")
                continue
            overlap = cpus & seen
            if overlap:
                self.fail(f"numa_cpus.{cell}", f"vCPUs {format_cpuset(overlap)} are already in another cell")
            seen |= cpus
            cells.append(GuestCellSpec(cell, cpus, int(mem)))
        if len(cells) != count or vcpus is None or memory_mib is None:
            return count, ()
        if seen != set(range(vcpus)):
            missing = set(range(vcpus)) - seen
            extra = seen - set(range(vcpus))
            if missing:
                self.fail("numa_cpus", f"vCPUs {format_cpuset(missing)} are in no cell (every vCPU 0-{vcpus - 1} needs one)")
            if extra:
                self.fail("numa_cpus", f"vCPUs {format_cpuset(extra)} do not exist (guest has {vcpus})")
        total = sum(c.memory_mib for c in cells)
        if total != memory_mib:
            self.fail("numa_mem", f"cells add up to {total} MiB, memory_mib is {memory_mib}")
        return count, tuple(cells)

    def _memory_nodes(self, values: dict[str, Any], per_cell: dict[int, Any], numa_nodes: int | None,
                      cells: tuple[GuestCellSpec, ...]) -> tuple[int | None, dict[int, int]]:
        """`memory_node`: the host memory-only node(s) for guest memory, whole guest or per cell.

        Only the shape is checked here; whether the node exists on a host, is
        memory-only and has room is the engine's question (a NoFit), since the
        same request may fit another host.
        """
        whole = values.get("memory_node")
        if whole is not None and per_cell:
            self.fail("memory_node", "give one node for the whole guest or one per cell (memory_node.N), not both")
            return None, {}
        if whole is not None:
            return self._host_node(whole, "memory_node"), {}
        if not per_cell:
            return None, {}
        count = len(cells) or numa_nodes
        if count is None:
            self.fail("memory_node", "per-cell nodes need the guest's cells fixed (numa_nodes or numa_cpus/numa_mem); "
                      "for the whole guest give one node: memory_node: N")
            return None, {}
        result: dict[int, int] = {}
        for cell, raw in sorted(per_cell.items()):
            where = f"memory_node.{cell}"
            if cell >= count:
                cells_text = "1 cell: 0" if count == 1 else f"{count} cells: 0-{count - 1}"
                self.fail(where, f"cell {cell} does not exist (the guest has {cells_text})")
                continue
            node = self._host_node(raw, where)
            if node is not None:
                result[cell] = node
        return None, result

    def _host_node(self, raw: Any, where: str) -> int | None:
        if not _is_int(raw) or not 0 <= raw <= MAX_HOST_NODE:
            self.fail(where, f"must be a host NUMA node id 0..{MAX_HOST_NODE} (a memory-only node), got {raw!r}")
            return None
        return int(raw)

    def _policy_conflicts(self, values: dict[str, Any], cpu_policy: str, thread_policy: str,
                          emulator: str, workload: str) -> None:
        pinned = cpu_policy in ("dedicated", "mixed") or workload == "latency-critical"
        if values.get("thread_policy") is not None and thread_policy != "prefer" and not pinned:
            self.fail("thread_policy", f"{thread_policy} applies to dedicated vCPUs; cpu_policy is {cpu_policy}")
        if emulator == "isolate" and not pinned:
            self.fail("emulator_threads", "isolate needs dedicated vCPUs (cpu_policy dedicated or mixed)")
        if workload == "latency-critical" and thread_policy == "require":
            self.fail("thread_policy", "latency-critical guests get whole cores with idle siblings (isolate); require would co-run their own vCPUs on siblings")
        if workload == "latency-critical" and cpu_policy == "mixed":
            self.fail("cpu_policy", "latency-critical guests are fully dedicated; mixed leaves vCPUs floating")


def _same_number(a: Any, b: Any) -> bool:
    try:
        return float(str(a)) == float(str(b))
    except ValueError:
        return str(a).strip() == str(b).strip()


def _same_value(a: Any, b: Any, native: str = "") -> bool:
    """Equal after normalising ('2MB' and '2048' are the same page size)."""
    if native == "mem_page_size":
        try:
            return parse_page_size(a) == parse_page_size(b)
        except ValueError:
            return False
    return str(a).strip().lower() == str(b).strip().lower()
