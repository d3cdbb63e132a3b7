"""GuestSpec validation: native fields, OpenStack extra specs, every problem reported at once."""

from __future__ import annotations

import pytest

from vmplacer.core.placement.guest import GuestSpec, GuestSpecError, parse_page_size


def spec(**fields) -> GuestSpec:
    base = {"name": "db1", "vcpus": 4, "memory_mib": 4096}
    base.update(fields)
    return GuestSpec.from_mapping(base)


def problems(**fields) -> list[str]:
    with pytest.raises(GuestSpecError) as caught:
        spec(**fields)
    return [str(p) for p in caught.value.problems]


def test_minimal_guest_gets_documented_defaults():
    guest = spec()
    assert (guest.cpu_policy, guest.thread_policy, guest.mem_mode) == ("shared", "prefer", "strict")
    assert (guest.mem_page_size, guest.emulator_threads, guest.workload_class) == ("small", "share", "unknown")
    assert guest.numa_nodes is None and guest.numa_cells == ()
    assert guest.dedicated_vcpu_set == frozenset()


def test_every_problem_is_reported_with_guest_field_and_reason():
    with pytest.raises(GuestSpecError) as caught:
        GuestSpec.from_mapping({"name": "db1", "vcpus": "x", "memory_mib": -1, "colour": "red",
                                "cpu_policy": "pinned"})
    lines = str(caught.value).splitlines()
    assert "guest db1: field vcpus: must be an integer 1..1024, got 'x'" in lines
    assert any(line.startswith("guest db1: field memory_mib: must be an integer 1..") for line in lines)
    assert any(line.startswith("guest db1: field colour: unknown field") for line in lines)
    assert "guest db1: field cpu_policy: must be one of shared, dedicated, mixed, got 'pinned'" in lines
    assert len(caught.value.problems) == 4


@pytest.mark.parametrize("name", ["db-1", "web.2", "a+b_c", "x" * 64, "A9"])
def test_libvirt_safe_names_are_accepted(name):
    assert spec(name=name).name == name


@pytest.mark.parametrize("name", ["", "a b", "a<b", "a&b", "a'b", 'a"b', "a;rm -rf", "a/b", "$(x)",
                                  "x" * 65, "-rf", "..", "ümlaut", 7, None])
def test_unsafe_names_are_rejected(name):
    with pytest.raises(GuestSpecError) as caught:
        GuestSpec.from_mapping({"name": name, "vcpus": 1, "memory_mib": 1})
    assert [p.field for p in caught.value.problems] == ["name"]


@pytest.mark.parametrize("value, expected", [
    ("small", "small"), ("large", "large"), ("any", "any"), ("2MB", 2048), ("2MiB", 2048),
    ("1GB", 1048576), ("1G", 1048576), (2048, 2048), ("2048", 2048), ("4KB", "small"), (4, "small"),
])
def test_page_sizes(value, expected):
    assert parse_page_size(value) == expected
    assert spec(mem_page_size=value).mem_page_size == expected


@pytest.mark.parametrize("value", ["3MB", "huge", 0, 3, True, "2 MB MB", [2048]])
def test_bad_page_sizes(value):
    assert any("mem_page_size" in line for line in problems(mem_page_size=value))


def test_extra_specs_map_to_native_fields():
    guest = spec(vcpus=4, memory_mib=4096, extra_specs={
        "hw:cpu_policy": "dedicated", "hw:cpu_thread_policy": "isolate", "hw:numa_nodes": "2",
        "hw:numa_cpus.0": "0,1", "hw:numa_cpus.1": "2-3", "hw:numa_mem.0": "1024", "hw:numa_mem.1": "3072",
        "hw:mem_page_size": "2048", "hw:emulator_threads_policy": "isolate",
        "quota:cpu_shares": "2048",  # another service's namespace: ignored
    })
    assert (guest.cpu_policy, guest.thread_policy, guest.emulator_threads) == ("dedicated", "isolate", "isolate")
    assert guest.numa_nodes == 2 and guest.mem_page_size == 2048
    assert [(c.id, sorted(c.vcpus), c.memory_mib) for c in guest.numa_cells] == [(0, [0, 1], 1024), (1, [2, 3], 3072)]


def test_extra_spec_conflicting_with_native_field_is_reported():
    lines = problems(cpu_policy="shared", extra_specs={"hw:cpu_policy": "dedicated"})
    assert lines == ["guest db1: field extra_specs.hw:cpu_policy: conflicts with cpu_policy='shared'"]


def test_extra_spec_agreeing_with_native_field_is_fine():
    assert spec(mem_page_size="2MB", extra_specs={"hw:mem_page_size": "2048"}).mem_page_size == 2048


def test_unknown_hw_extra_spec_is_rejected():
    lines = problems(extra_specs={"hw:cpu_polcy": "dedicated"})
    assert len(lines) == 1 and "extra_specs.hw:cpu_polcy: not supported" in lines[0]


def test_mixed_policy_needs_a_dedicated_mask():
    assert any("dedicated_vcpus: is required with cpu_policy mixed" in line for line in problems(cpu_policy="mixed"))
    guest = spec(cpu_policy="mixed", dedicated_vcpus="1-3")
    assert guest.dedicated_vcpu_set == frozenset({1, 2, 3})
    nova_style = spec(extra_specs={"hw:cpu_policy": "mixed", "hw:cpu_dedicated_mask": "^0"})
    assert nova_style.dedicated_vcpu_set == frozenset({1, 2, 3})


@pytest.mark.parametrize("mask", ["0-3", "^0-3", "7", "x"])
def test_bad_dedicated_masks(mask):
    assert any("dedicated_vcpus" in line for line in problems(cpu_policy="mixed", dedicated_vcpus=mask))


def test_mask_without_mixed_is_rejected():
    assert any("only applies to cpu_policy mixed" in line
               for line in problems(cpu_policy="dedicated", dedicated_vcpus="0"))


@pytest.mark.parametrize("fields, fragment", [
    ({"numa_cpus": {"0": "0-1", "1": "2-3"}}, "have numa_cpus but no numa_mem"),
    ({"numa_cpus": {"0": "0-2", "1": "2-3"}, "numa_mem": {"0": 2048, "1": 2048}}, "already in another cell"),
    ({"numa_cpus": {"0": "0", "1": "2-3"}, "numa_mem": {"0": 2048, "1": 2048}}, "are in no cell"),
    ({"numa_cpus": {"0": "0-1", "1": "2-3"}, "numa_mem": {"0": 1024, "1": 1024}}, "add up to 2048 MiB"),
    ({"numa_nodes": 3, "numa_cpus": {"0": "0-1", "1": "2-3"}, "numa_mem": {"0": 2048, "1": 2048}},
     "cells must be numbered 0..2"),
    ({"numa_nodes": 5}, "5 cells cannot each hold a vCPU of 4"),
])
def test_numa_cell_problems(fields, fragment):
    assert any(fragment in line for line in problems(**fields))


def test_flat_numa_keys_are_accepted():
    guest = spec(**{"numa_cpus.0": "0-1", "numa_cpus.1": [2, 3], "numa_mem.0": 1024, "numa_mem.1": 3072})
    assert guest.numa_nodes == 2 and guest.numa_cells[1].vcpus == frozenset({2, 3})


def test_labels_and_priority():
    guest = spec(labels={"team": "db", "priority": 10, "tier.v1/x": "a b"})
    assert guest.labels == {"team": "db", "priority": "10", "tier.v1/x": "a b"}
    assert guest.priority == 10
    assert any("labels.priority" in line for line in problems(labels={"priority": "high"}))
    assert any("labels.bad key" in line for line in problems(labels={"bad key": "x"}))
    assert any("control characters" in line for line in problems(labels={"x": "a\x00b"}))
    assert any("at most 256" in line for line in problems(labels={"x": "a" * 300}))


def test_affinity_lists():
    guest = spec(affinity=["web1"], anti_affinity="db2")
    assert guest.affinity == ("web1",) and guest.anti_affinity == ("db2",)
    assert any("cannot name itself" in line for line in problems(anti_affinity=["db1"]))
    assert any("also listed in affinity" in line for line in problems(affinity=["x"], anti_affinity=["x"]))


@pytest.mark.parametrize("fields, field", [
    ({"thread_policy": "isolate"}, "thread_policy"),  # shared vCPUs have no threads to isolate
    ({"emulator_threads": "isolate"}, "emulator_threads"),
    ({"workload_class": "latency-critical", "cpu_policy": "dedicated", "thread_policy": "require"}, "thread_policy"),
    ({"workload_class": "latency-critical", "cpu_policy": "mixed", "dedicated_vcpus": "0"}, "cpu_policy"),
])
def test_policy_conflicts(fields, field):
    with pytest.raises(GuestSpecError) as caught:
        spec(**fields)
    assert field in [p.field for p in caught.value.problems]


def test_latency_critical_is_dedicated_and_isolated_even_when_shared():
    guest = spec(workload_class="latency-critical")
    assert guest.cpu_policy == "shared"
    assert guest.dedicated_vcpu_set == frozenset(range(4))
    assert guest.effective_thread_policy == "isolate"


def test_to_dict_round_trips():
    guest = spec(cpu_policy="mixed", dedicated_vcpus="1-3", numa_cpus={"0": "0-1", "1": "2-3"},
                 numa_mem={"0": 2048, "1": 2048}, mem_page_size="1GB", labels={"priority": 3},
                 affinity=["a"], anti_affinity=["b"], mem_mode="interleave")
    assert GuestSpec.from_mapping(guest.to_dict()) == guest


def test_not_a_mapping():
    with pytest.raises(GuestSpecError, match="must be a mapping"):
        GuestSpec.from_mapping(["db1"])


def test_workload_class_extra_spec_becomes_the_class_label():
    guest = spec(extra_specs={"vmplacer:workload_class": "web-frontend"})
    assert guest.labels["workload_class"] == "web-frontend"
    assert guest.workload_class == "unknown"  # not one of the native classes: the field keeps its default
    native = spec(extra_specs={"vmplacer:workload_class": "latency-critical"})
    assert (native.workload_class, native.labels["workload_class"]) == ("latency-critical", "latency-critical")
    same = spec(labels={"workload_class": "web"}, extra_specs={"vmplacer:workload_class": "web"})
    assert same.labels["workload_class"] == "web"


@pytest.mark.parametrize("fields, message", [
    ({"extra_specs": {"vmplacer:workload_class": "bad class"}}, "must be a class name"),
    ({"extra_specs": {"vmplacer:workload_class": 3}}, "must be a class name"),
    ({"extra_specs": {"vmplacer:workload_class": ""}}, "must be a class name"),
    ({"labels": {"workload_class": "db"}, "extra_specs": {"vmplacer:workload_class": "web"}},
     "conflicts with labels.workload_class='db'"),
    ({"workload_class": "batch", "extra_specs": {"vmplacer:workload_class": "latency-critical"}},
     "conflicts with workload_class='batch'"),
])
def test_workload_class_extra_spec_is_validated(fields, message):
    lines = problems(**fields)
    assert len(lines) == 1 and lines[0].startswith("guest db1: field extra_specs.vmplacer:workload_class: ")
    assert message in lines[0]


def test_unknown_vmplacer_extra_spec_lists_the_class_spec():
    (line,) = problems(extra_specs={"vmplacer:workload": "web"})
    assert "vmplacer:workload_class" in line and "vmplacer:protect" in line
