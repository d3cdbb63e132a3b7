"""Whose fault a refused domain is: decided by libvirt's error code, never its (translated) text."""

from __future__ import annotations

import libvirt
import pytest

from vmplacer.adapters.libvirt_errors import (
    EXISTS,
    INVALID,
    DomainRefused,
    operation_failed,
    refused_definition,
    refused_start,
)
from vmplacer.ports import DomainGone, HypervisorError


def _error(code: int, message: str = "something") -> libvirt.libvirtError:
    exc = libvirt.libvirtError(message)
    exc.err = (code, libvirt.VIR_FROM_DOMAIN, message, 2, None, None, None, 0, 0)
    return exc


@pytest.mark.parametrize("code", [libvirt.VIR_ERR_XML_ERROR, libvirt.VIR_ERR_XML_DETAIL,
                                  libvirt.VIR_ERR_CONFIG_UNSUPPORTED, libvirt.VIR_ERR_XML_INVALID_SCHEMA,
                                  libvirt.VIR_ERR_OS_TYPE, libvirt.VIR_ERR_INVALID_ARG])
def test_an_invalid_document_is_the_callers(code):
    refused = refused_definition(_error(code, "bad"), host="h1", domain="g1", what="defineXML", clash=lambda: None)
    assert isinstance(refused, DomainRefused) and isinstance(refused, HypervisorError)
    assert refused.reason == INVALID and not refused.retriable
    assert str(refused) == "host h1, domain g1: defineXML refused: bad"


@pytest.mark.parametrize("code", [libvirt.VIR_ERR_OPERATION_FAILED, libvirt.VIR_ERR_INTERNAL_ERROR])
def test_a_generic_failure_is_a_clash_only_when_another_domain_holds_the_name_or_uuid(code):
    failed = _error(code, "operation failed")
    assert refused_definition(failed, host="h1", domain="g1", what="defineXML", clash=lambda: None) is None
    refused = refused_definition(failed, host="h1", domain="g1", what="defineXML",
                                 clash=lambda: "domain other already has the UUID u")
    assert refused is not None and refused.reason == EXISTS
    assert "domain other already has the UUID u" in str(refused)


@pytest.mark.parametrize("code", [libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_ERR_RPC, libvirt.VIR_ERR_NO_CONNECT,
                                  libvirt.VIR_ERR_OPERATION_TIMEOUT])
def test_host_faults_stay_the_hosts(code):
    assert refused_definition(_error(code), host="h1", domain="g1", what="defineXML",
                              clash=lambda: "never asked") is None
    assert refused_start(_error(code), host="h1", domain="g1") is None


def test_starting_on_what_the_host_lacks_is_the_callers():
    refused = refused_start(_error(libvirt.VIR_ERR_NO_NETWORK, "network 'lab' not found"), host="h1", domain="g1")
    assert refused is not None and refused.reason == INVALID and "network 'lab' not found" in str(refused)


@pytest.mark.parametrize("code", [libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_ERR_RPC, libvirt.VIR_ERR_NO_CONNECT,
                                  libvirt.VIR_ERR_INVALID_CONN, libvirt.VIR_ERR_OPERATION_TIMEOUT,
                                  libvirt.VIR_ERR_AGENT_UNRESPONSIVE, libvirt.VIR_ERR_RESOURCE_BUSY])
def test_a_briefly_unavailable_host_is_retriable(code):
    failed = operation_failed(_error(code, "busy"), host="h1", domain="g1", what="pinVcpu")
    assert failed.retriable and not isinstance(failed, DomainGone)
    assert str(failed) == "host h1, domain g1: pinVcpu failed: busy"


@pytest.mark.parametrize("code", [libvirt.VIR_ERR_INTERNAL_ERROR, libvirt.VIR_ERR_OPERATION_FAILED,
                                  libvirt.VIR_ERR_OPERATION_INVALID, libvirt.VIR_ERR_ACCESS_DENIED])
def test_an_internal_error_is_a_host_fault_not_worth_a_retry(code):
    failed = operation_failed(_error(code, "process exited while connecting to monitor"), host="h1", domain="",
                              what="create")
    assert type(failed) is HypervisorError and not failed.retriable
    assert str(failed) == "host h1: create failed: process exited while connecting to monitor"


def test_a_missing_domain_is_gone():
    assert isinstance(operation_failed(_error(libvirt.VIR_ERR_NO_DOMAIN), host="h1", domain="g1", what="lookup"),
                      DomainGone)
