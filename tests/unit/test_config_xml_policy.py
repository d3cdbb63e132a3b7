"""Per-host domain XML policy settings: defaults, the example file, and errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vmplacer.config import ConfigError, XmlPolicySettings, load_settings, settings_from_mapping

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vmplacer.yaml"


def _host(**policy: object) -> dict:
    return {"hosts": [{"name": "h1", "uri": "qemu:///system", "xml_policy": policy}]}


def test_default_is_no_exception_and_the_hosts_own_storage_pools():
    settings = settings_from_mapping({"hosts": [{"name": "h1", "uri": "qemu:///system"}]}, "c.yaml", {})
    assert settings.hosts[0].xml_policy == XmlPolicySettings(frozenset(), None)


def test_exceptions_and_storage_paths_are_read():
    settings = settings_from_mapping(_host(allow=["direct-boot", "hostdev"], storage_paths=["/srv/guests"]),
                                     "c.yaml", {})
    assert settings.hosts[0].xml_policy == XmlPolicySettings(frozenset({"direct-boot", "hostdev"}), ("/srv/guests",))


def test_the_example_documents_every_exception_and_is_valid():
    from vmplacer.adapters.domain_xml_policy import EXCEPTIONS

    text = EXAMPLE.read_text()
    assert all(name in text for name in EXCEPTIONS)
    hosts = load_settings(EXAMPLE, environ={}).hosts
    assert any(h.xml_policy.storage_paths for h in hosts)
    assert yaml.safe_load(text)["hosts"]


@pytest.mark.parametrize("policy, key, fragment", [
    ({"allow": ["hostdevs"]}, "hosts[0].xml_policy.allow[0]", "unknown exception 'hostdevs'"),
    ({"allow": "hostdev"}, "hosts[0].xml_policy.allow", "must be a list"),
    ({"storage_paths": ["images"]}, "hosts[0].xml_policy.storage_paths[0]", "must be an absolute path"),
    ({"storage_paths": ["/srv/a/../../etc"]}, "hosts[0].xml_policy.storage_paths[0]", "without '..'"),
    ({"storage_paths": ["/srv/images/"]}, "hosts[0].xml_policy.storage_paths[0]", "trailing '/'"),
    ({"storage_paths": ["/ok", "/etc"]}, "hosts[0].xml_policy.storage_paths[1]", "system directory"),
    ({"storage_paths": "/srv/images"}, "hosts[0].xml_policy.storage_paths", "must be a list"),
    ({"deny": []}, "hosts[0].xml_policy.deny", "unknown key"),
])
def test_bad_settings_name_the_file_and_the_key(policy, key, fragment):
    with pytest.raises(ConfigError) as refused:
        settings_from_mapping(_host(**policy), "c.yaml", {})
    message = str(refused.value)
    assert message.startswith(f"c.yaml: key '{key}'") and fragment in message
