"""Whose fault a refused domain definition is: the document's, or the host's.

libvirt answers a bad domain XML (a missing `<os>`, an unknown device model,
a UUID another domain has) with the same exception as a daemon that fell
over. Callers must tell the two apart: the first is the caller's mistake (an
API client gets a 4xx naming its XML and must not retry), the second the
host's (502/503, maybe worth a retry). Only the error code decides, never
the message text, which libvirt translates.

Every other failure is the host's: retriable (503 with Retry-After, the
executor tries again) only when the code says the daemon, the connection or
the domain was briefly unavailable. VIR_ERR_INTERNAL_ERROR is not one of
them: libvirt uses it for a QEMU that died, a monitor that answered
nonsense, a broken driver state, none of which a retry cures (502). A
definition refused with it is still the caller's when a lookup finds another
domain holding the XML's name or UUID.
"""

from __future__ import annotations

from collections.abc import Callable

import libvirt

from vmplacer.ports import DomainGone, HypervisorError

# The document is invalid, or asks for something this host does not offer.
_INVALID_DEFINITION = frozenset({
    libvirt.VIR_ERR_INVALID_ARG,
    libvirt.VIR_ERR_OS_TYPE,
    libvirt.VIR_ERR_NO_KERNEL,
    libvirt.VIR_ERR_NO_ROOT,
    libvirt.VIR_ERR_NO_SOURCE,
    libvirt.VIR_ERR_NO_TARGET,
    libvirt.VIR_ERR_NO_NAME,
    libvirt.VIR_ERR_NO_OS,
    libvirt.VIR_ERR_NO_DEVICE,
    libvirt.VIR_ERR_XML_ERROR,
    libvirt.VIR_ERR_XML_DETAIL,
    libvirt.VIR_ERR_INVALID_MAC,
    libvirt.VIR_ERR_CONFIG_UNSUPPORTED,
    libvirt.VIR_ERR_CPU_INCOMPATIBLE,
    libvirt.VIR_ERR_XML_INVALID_SCHEMA,
})
# Starting: the document names a network, volume or device the host lacks.
_MISSING_ON_START = frozenset({
    libvirt.VIR_ERR_NO_NETWORK,
    libvirt.VIR_ERR_NO_STORAGE_POOL,
    libvirt.VIR_ERR_NO_STORAGE_VOL,
    libvirt.VIR_ERR_NO_NODE_DEVICE,
    libvirt.VIR_ERR_NO_NWFILTER,
    libvirt.VIR_ERR_NO_SECRET,
})
# A name or UUID in use: a dedicated code, or a generic one (told apart by a lookup).
_CLASH = frozenset({libvirt.VIR_ERR_DOM_EXIST, libvirt.VIR_ERR_OPERATION_FAILED, libvirt.VIR_ERR_INTERNAL_ERROR})
# Briefly unavailable: the daemon or the network hiccuped, the domain or its agent is busy.
TRANSIENT = frozenset({
    libvirt.VIR_ERR_SYSTEM_ERROR,  # e.g. the connection's socket broke
    libvirt.VIR_ERR_RPC,
    libvirt.VIR_ERR_NO_CONNECT,
    libvirt.VIR_ERR_INVALID_CONN,
    libvirt.VIR_ERR_OPERATION_TIMEOUT,
    libvirt.VIR_ERR_AGENT_UNRESPONSIVE,
    libvirt.VIR_ERR_RESOURCE_BUSY,
})
_GONE = frozenset({libvirt.VIR_ERR_NO_DOMAIN})

INVALID = "invalid-xml"
EXISTS = "exists"


class DomainRefused(HypervisorError):
    """libvirt refused a domain because of what its XML says: `reason` is INVALID (the
    document is wrong or asks for what the host lacks) or EXISTS (its name or UUID
    belongs to another domain). Never retriable: the same XML fails again."""

    def __init__(self, message: str, *, host: str, domain: str, reason: str):
        super().__init__(message, host=host, domain=domain, retriable=False)
        self.reason = reason


def refused_definition(exc: libvirt.libvirtError, *, host: str, domain: str, what: str,
                       clash: Callable[[], str | None]) -> DomainRefused | None:
    """A DomainRefused when `exc` (from defineXML) blames the document, else None.
    `clash` names the domain holding the XML's name or UUID, if one does."""
    code = exc.get_error_code()
    message = f"host {host}, domain {domain}: {what} refused: {exc.get_error_message()}"
    if code in _INVALID_DEFINITION:
        return DomainRefused(message, host=host, domain=domain, reason=INVALID)
    if code in _CLASH:
        holder = clash()
        if holder:
            return DomainRefused(f"host {host}, domain {domain}: {what} refused: {holder}", host=host,
                                 domain=domain, reason=EXISTS)
    return None


def refused_start(exc: libvirt.libvirtError, *, host: str, domain: str) -> DomainRefused | None:
    """A DomainRefused when starting failed on what the domain's XML asks for."""
    code = exc.get_error_code()
    if code in _INVALID_DEFINITION or code in _MISSING_ON_START:
        return DomainRefused(f"host {host}, domain {domain}: start refused: {exc.get_error_message()}",
                             host=host, domain=domain, reason=INVALID)
    return None


def operation_failed(exc: libvirt.libvirtError, *, host: str, domain: str, what: str) -> HypervisorError:
    """What a failed libvirt call on a host means: the domain is gone, the host is briefly
    unavailable (retriable), or the host failed (not retriable)."""
    subject = f"host {host}" + (f", domain {domain}" if domain else "")
    message = f"{subject}: {what} failed: {exc.get_error_message()}"
    code = exc.get_error_code()
    if code in _GONE:
        return DomainGone(message, host=host, domain=domain)
    return HypervisorError(message, host=host, domain=domain, retriable=code in TRANSIENT)
