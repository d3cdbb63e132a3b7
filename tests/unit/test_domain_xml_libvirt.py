"""Rendered XML through libvirt's own parser: the in-process test driver (no daemon needed).

libvirt reads each golden case, formats it back in its own style, and the
parser must recover exactly the placement that was rendered.
"""

from __future__ import annotations

import pytest

from tests.support import require
from tests.unit.test_domain_xml import CASES
from vmplacer.adapters.domain_xml import parse_labels, parse_placement


@pytest.fixture(scope="module")
def test_driver():
    try:
        import libvirt
    except ImportError:
        libvirt = None
    require(libvirt is not None, "libvirt-python is not installed")
    conn = libvirt.open("test:///default")
    yield conn
    conn.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_libvirt_accepts_and_formats_back_the_same_placement(test_driver, case):
    import libvirt

    xml = case.render()
    domain = test_driver.defineXML(xml)
    try:
        formatted = domain.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        assert formatted != xml  # libvirt's own formatting (quotes, added defaults)
        assert parse_placement(formatted, case.placement.host) == case.placement
        assert parse_labels(formatted) == case.guest.labels
    finally:
        domain.undefine()
