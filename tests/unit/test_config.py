"""Config loading: defaults, environment overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmplacer.config import EXAMPLE_CAPABILITIES, ConfigError, load_settings, settings_from_mapping


def test_missing_config_means_the_example_host_and_sqlite(tmp_path):
    settings = load_settings(None, environ={"VMPLACER_DATA_DIR": str(tmp_path)})
    assert [(h.name, h.uri) for h in settings.hosts] == [("example", "test:///default")]
    (host,) = settings.hosts
    assert host.is_builtin_example and host.capabilities == EXAMPLE_CAPABILITIES and host.capabilities.is_file()
    assert settings.database_url == f"sqlite:///{tmp_path / 'vmplacer.db'}"
    assert settings.data_dir == tmp_path


def test_full_example_config_is_valid(tmp_path):
    example = Path(__file__).resolve().parents[2] / "examples" / "vmplacer.yaml"
    settings = load_settings(example, environ={})
    assert settings.hosts and all(h.uri for h in settings.hosts)
    assert settings.profiler.t_m_ms > 0


def test_environment_overrides_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("database_url: sqlite:////tmp/a.db\ndata_dir: /tmp/x\n")
    settings = load_settings(
        config,
        environ={"VMPLACER_DATABASE_URL": "postgresql://u:p@db/v", "VMPLACER_DATA_DIR": str(tmp_path)},
    )
    assert settings.database_url == "postgresql+psycopg://u:p@db/v"
    assert settings.data_dir == tmp_path


def test_config_found_through_environment_variable(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("hosts:\n  - {name: h1, uri: 'qemu:///system', reserved_cpus: '0-1'}\n")
    settings = load_settings(None, environ={"VMPLACER_CONFIG": str(config)})
    assert settings.host("h1").reserved_cpus == frozenset({0, 1})


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({"databse_url": "sqlite://"}, "databse_url"),
        ({"hosts": [{"name": "h", "uri": "http://example.com"}]}, "hosts[0].uri"),
        ({"hosts": [{"name": "h", "uri": "qemu:///nowhere"}]}, "hosts[0].uri"),
        ({"hosts": [{"name": "h"}]}, "hosts[0].uri"),
        ({"hosts": [{"name": "bad name", "uri": "test:///default"}]}, "hosts[0].name"),
        ({"hosts": [{"name": "h", "uri": "test:///default", "colour": 1}]}, "hosts[0].colour"),
        ({"hosts": [{"name": "h", "uri": "test:///default", "reserved_cpus": "0-x"}]}, "hosts[0].reserved_cpus"),
        ({"hosts": [{"name": "h", "uri": "test:///default"}, {"name": "h", "uri": "test:///default"}]}, "hosts"),
        ({"database_url": "mysql://x"}, "database_url"),
        ({"profiler": {"t_m_ms": -1}}, "profiler.t_m_ms"),
        ({"profiler": {"freeze": 1}}, "profiler.freeze"),
        ({"api": {"listen": "nowhere"}}, "api.listen"),
        (["not", "a", "mapping"], ""),
    ],
)
def test_errors_name_the_key(document, key):
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping(document, "cfg.yaml", environ={})
    assert f"key '{key}'" in str(excinfo.value)
    assert "cfg.yaml" in str(excinfo.value)


def test_unreadable_and_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.yaml", environ={})
    with pytest.raises(ConfigError, match="unreadable"):
        load_settings(tmp_path, environ={})  # a directory
    broken = tmp_path / "broken.yaml"
    broken.write_text("hosts: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_settings(broken, environ={})


def test_unknown_host_lookup_lists_configured_ones(tmp_path):
    settings = load_settings(None, environ={"VMPLACER_DATA_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match="configured: example"):
        settings.host("missing")


def test_allocation_knobs_per_host():
    settings = settings_from_mapping({"hosts": [
        {"name": "h1", "uri": "qemu:///system", "cpu_allocation_ratio": 2, "reserved_memory_mib_per_node": 1024,
         "emulator_cpus": "0,28"},
        {"name": "h2", "uri": "qemu:///system"},
    ]}, "cfg.yaml", environ={})
    tuned, default = settings.host("h1").allocation, settings.host("h2").allocation
    assert (tuned.cpu_allocation_ratio, tuned.reserved_memory_mib_per_node, tuned.emulator_cpus) == (
        2.0, 1024, frozenset({0, 28}))
    assert (default.cpu_allocation_ratio, default.reserved_memory_mib_per_node, default.emulator_cpus) == (
        4.0, 0, frozenset())


def test_domain_resync_interval_per_host():
    settings = settings_from_mapping({"hosts": [
        {"name": "h1", "uri": "qemu:///system", "domain_resync_s": 0},
        {"name": "h2", "uri": "qemu:///system", "domain_resync_s": 30},
        {"name": "h3", "uri": "qemu:///system"},
    ]}, "cfg.yaml", environ={})
    assert [settings.host(h).domain_resync_s for h in ("h1", "h2", "h3")] == [0.0, 30.0, 5.0]


def test_connect_timeout_per_host():
    settings = settings_from_mapping({"hosts": [
        {"name": "h1", "uri": "qemu+tcp://far/system", "connect_timeout_s": 90},
        {"name": "h2", "uri": "qemu:///system"},
    ]}, "cfg.yaml", environ={})
    assert [settings.host(h).connect_timeout_s for h in ("h1", "h2")] == [90.0, 30.0]


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("cpu_allocation_ratio", 0, "between 0.1 and 64"),
    ("cpu_allocation_ratio", "lots", "must be a number"),
    ("reserved_memory_mib_per_node", -1, "between 0"),
    ("reserved_memory_mib_per_node", 1.5, "whole number of MiB"),
    ("emulator_cpus", "0-x", "0-x"),
    ("domain_resync_s", -1, "between 0 and 3600"),
    ("domain_resync_s", "often", "must be a number"),
    ("connect_timeout_s", 0, "between 1 and 3600"),
    ("connect_timeout_s", "forever", "must be a number"),
])
def test_bad_allocation_knobs_name_host_and_field(field, value, fragment):
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping({"hosts": [{"name": "h", "uri": "qemu:///system", field: value}]}, "cfg.yaml", environ={})
    assert f"key 'hosts[0].{field}'" in str(excinfo.value)
    assert fragment in str(excinfo.value)


def test_profiler_scope_and_sensitive_set_come_from_the_config():
    settings = settings_from_mapping({"profiler": {"scope": ["web-*", "db-*"], "sensitive": "class:latency-critical"}},
                                     "cfg.yaml", environ={})
    assert settings.profiler.scope == ("web-*", "db-*")
    assert settings.profiler.sensitive == "class:latency-critical"
    assert settings_from_mapping(None, "cfg.yaml", environ={}).profiler.scope == ("*",)
    assert settings_from_mapping({"profiler": {"pair_probes": 0}}, "cfg.yaml", environ={}).profiler.pair_probes == 0


@pytest.mark.parametrize(("profiler", "key"), [
    ({"scope": []}, "profiler.scope"),
    ({"scope": "web-*"}, "profiler.scope"),
    ({"sensitive": "some"}, "profiler.sensitive"),
    ({"sensitive": "label:=x"}, "profiler.sensitive"),
    ({"pair_probes": -1}, "profiler.pair_probes"),
    ({"pair_probes": 1.5}, "profiler.pair_probes"),
    ({"pair_probes": True}, "profiler.pair_probes"),
])
def test_bad_profiler_scope_or_sensitive_names_the_key(profiler, key):
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping({"profiler": profiler}, "cfg.yaml", environ={})
    assert f"key '{key}'" in str(excinfo.value)


def test_profile_command_defaults_to_the_configured_scope_and_sensitive_set():
    import argparse

    from vmplacer.cli.profile import build_config

    settings = settings_from_mapping({"profiler": {"scope": ["web-*"], "sensitive": "label:tier=gold"}},
                                     "cfg.yaml", environ={})
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    from vmplacer.cli import profile as profile_cli

    profile_cli.register(sub)
    config = build_config(parser.parse_args(["profile", "--host", "h"]), settings)
    assert config.scope == ("web-*",)
    assert config.pair_probes == settings.profiler.pair_probes == 4
    assert config.sensitive.labels == (("tier", "gold"),)
    override = build_config(parser.parse_args(["profile", "--host", "h", "--scope", "db-*", "--sensitive", "all"]),
                            settings)
    assert override.scope == ("db-*",)
    assert override.sensitive.labels == ()


def test_a_test_driver_host_may_take_its_topology_from_a_file_relative_to_the_config(tmp_path):
    (tmp_path / "hosts").mkdir()
    caps = tmp_path / "hosts" / "big.xml"
    caps.write_text("<capabilities/>")
    config = tmp_path / "vmplacer.yaml"
    config.write_text("hosts:\n  - {name: lab, uri: 'test:///default', capabilities: hosts/big.xml}\n"
                      "  - {name: plain, uri: 'test:///default'}\n")
    lab, plain = load_settings(config, environ={}).hosts
    assert lab.capabilities == caps.resolve() and not lab.is_builtin_example
    assert plain.capabilities is None  # libvirt's test driver as it is, reachable by its URI


@pytest.mark.parametrize("host, fragment", [
    ({"name": "h", "uri": "qemu:///system", "capabilities": "/etc/hostname"}, "only for libvirt's test driver"),
    ({"name": "h", "uri": "test:///default", "capabilities": "/nonexistent/caps.xml"}, "no such file"),
    ({"name": "h", "uri": "test:///default", "capabilities": 3}, "must be a non-empty string"),
])
def test_bad_capabilities_file_names_host_and_key(host, fragment):
    with pytest.raises(ConfigError) as error:
        settings_from_mapping({"hosts": [host]}, "c.yaml", environ={})
    assert "hosts[0].capabilities" in str(error.value) and fragment in str(error.value)


def test_placement_admission_settings_come_from_the_config():
    assert settings_from_mapping(None, "t", environ={}).placement.interference_weight == 1.0
    settings = settings_from_mapping({"placement": {"interference_weight": 2.5, "interference_candidates": 4,
                                                    "model_refresh": "5m"}}, "t", environ={})
    assert (settings.placement.interference_weight, settings.placement.interference_candidates,
            settings.placement.model_refresh_s) == (2.5, 4, 300.0)


@pytest.mark.parametrize("placement, key", [
    ({"interference_weight": -1}, "placement.interference_weight"),
    ({"interference_weight": "high"}, "placement.interference_weight"),
    ({"interference_candidates": 1.5}, "placement.interference_candidates"),
    ({"interference_candidates": True}, "placement.interference_candidates"),
    ({"model_refresh": "soon"}, "placement.model_refresh"),
    ({"model_refresh": 0}, "placement.model_refresh"),
    ({"weight": 1}, "placement.weight"),
])
def test_bad_placement_settings_name_the_key(placement, key):
    with pytest.raises(ConfigError, match=f"key '{key}'"):
        settings_from_mapping({"placement": placement}, "t", environ={})


# ----- every problem at once, duplicate keys, the example file, config show ------------------

def test_every_problem_is_reported_at_once_each_naming_its_key():
    document = {
        "hosts": [{"name": "bad name", "uri": "ftp://x", "cpu_allocation_ratio": 0},
                  {"uri": "qemu:///system", "colour": "red"}],
        "profiler": {"t_m_ms": -1, "freeze": 1},
        "api": {"listen": "nowhere"},
        "retention": {"plans": "soon"},
        "placement": {"model_refresh": 0},
        "protect": {"step": 9, "latency_critical_floor": 2},
        "bogus": 1,
    }
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping(document, "cfg.yaml", environ={})
    keys = ["bogus", "hosts[0].name", "hosts[0].uri", "hosts[0].cpu_allocation_ratio", "hosts[1].colour",
            "hosts[1].name", "profiler.freeze", "profiler.t_m_ms", "api.listen", "retention.plans",
            "placement.model_refresh", "protect.step", "protect.latency_critical_floor"]
    problems = excinfo.value.problems
    assert len(problems) == len(keys), problems
    for key in keys:
        assert any(p.startswith(f"cfg.yaml: key '{key}': ") for p in problems), key
    assert str(excinfo.value).splitlines() == list(problems)


def test_a_single_problem_is_one_line():
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping({"api": {"listen": "x"}}, "cfg.yaml", environ={})
    assert excinfo.value.problems == (str(excinfo.value),)


def test_an_unknown_key_is_quoted_and_bounded():
    with pytest.raises(ConfigError) as excinfo:
        settings_from_mapping({"x\x1b[2J" + "y" * 500: 1}, "cfg.yaml", environ={})
    assert "\x1b" not in str(excinfo.value) and len(str(excinfo.value)) < 400


def test_duplicate_keys_are_refused_naming_both_lines_with_the_other_problems(tmp_path):
    config = tmp_path / "vmplacer.yaml"
    config.write_text("api: {listen: 'a:1'}\nprofiler:\n  t_m_ms: 5\n  t_m_ms: -1\napi: {listen: 'b:2'}\n")
    with pytest.raises(ConfigError) as excinfo:
        load_settings(config, environ={})
    problems = excinfo.value.problems
    assert f"{config}: line 4, column 3: duplicate key 't_m_ms' (first at line 3)" in problems
    assert f"{config}: line 5, column 1: duplicate key 'api' (first at line 1)" in problems
    assert any("key 'profiler.t_m_ms'" in p for p in problems)  # the last value, checked too


def test_yaml_syntax_errors_name_the_file_and_line_not_pyyaml_internals(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("api:\n  listen: [a\n")
    with pytest.raises(ConfigError) as excinfo:
        load_settings(broken, environ={})
    text = str(excinfo.value)
    assert text.startswith(f"{broken}: invalid YAML at line 3, column 1:")
    assert "<unicode string>" not in text and "\n" not in text


def _key_paths(document: object, prefix: str = "") -> set[str]:
    """Every key path of a config document; the entries of a list of mappings share `name[]`."""
    paths: set[str] = set()
    if isinstance(document, dict):
        for key, value in document.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            paths.add(path)
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                for item in value:
                    paths |= _key_paths(item, f"{path}[]")
            else:
                paths |= _key_paths(value, path)
    return paths


def _model_key_paths() -> set[str]:
    """The key paths the reader accepts, from its table of keys per section."""
    from vmplacer.config import CONFIG_KEYS

    return {f"{section}.{key}" if section else key for section, keys in CONFIG_KEYS.items() for key in keys}


def test_the_example_config_lists_every_key_of_the_config_model():
    import yaml

    example = Path(__file__).resolve().parents[2] / "examples" / "vmplacer.yaml"
    listed = _key_paths(yaml.safe_load(example.read_text()))
    model = _model_key_paths()
    assert sorted(model - listed) == [], "keys missing from examples/vmplacer.yaml"
    assert sorted(listed - model) == [], "keys in examples/vmplacer.yaml that the reader refuses"


def test_the_key_table_covers_every_setting_of_the_model():
    """settings_to_mapping writes each field of the settings dataclasses under its key: the
    table the reader (and the example test) use has exactly those keys."""
    from vmplacer.config import settings_to_mapping

    settings = settings_from_mapping(None, "t", environ={})
    assert _key_paths(settings_to_mapping(settings)) == _model_key_paths()


def test_the_effective_config_reads_back_to_the_same_settings(tmp_path):
    from vmplacer.config import settings_to_mapping

    example = Path(__file__).resolve().parents[2] / "examples" / "vmplacer.yaml"
    settings = load_settings(example, environ={})
    again = settings_from_mapping(settings_to_mapping(settings), settings.source, environ={})
    assert again == settings
    tuned = settings_from_mapping({"retention": {"plans": "12h", "jobs": "90m"}, "placement": {"model_refresh": "1d"},
                                   "protect": {"batch_min_share": "none"}}, "t", environ={})
    assert settings_from_mapping(settings_to_mapping(tuned), "t", environ={}) == tuned
