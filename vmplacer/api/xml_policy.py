"""The domain XML policy at the API: which candidate hosts accept a caller's base XML, and 422s.

A caller's document is held to each candidate host's policy before anything
else happens (fit, claims, libvirt): a host that refuses it is no candidate,
and when every candidate refuses it the answer is 422 `xml-policy`, naming for
each host the element, the attribute and the rule. The XML vmplacer renders is
held to the policy again by both renderers (the placement service's and the dry runs').
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmplacer.adapters.domain_xml import parse_domain
from vmplacer.adapters.domain_xml_policy import DomainXmlPolicyError, Violation
from vmplacer.api.errors import ApiError
from vmplacer.ports import HypervisorError

if TYPE_CHECKING:
    from vmplacer.api.services import ApiServices

CODE = "xml-policy"


def admit_base_xml(services: ApiServices, guest: str, hosts: list[str], base_xml: str | None) -> list[str]:
    """The hosts among `hosts` whose policy accepts `base_xml` (all of them without one)."""
    if base_xml is None:
        return hosts
    root = parse_domain(base_xml, f"base_xml of guest {guest}")
    accepted: list[str] = []
    refused: list[tuple[str, list[Violation]]] = []
    unreadable: list[HypervisorError] = []
    for name in hosts:
        try:
            found = services.container.xml_policy(name).violations(root)
        except HypervisorError as exc:  # its emulators or pools cannot be read: not a candidate
            services.metrics.libvirt_error(exc)
            unreadable.append(exc)
            continue
        if found:
            refused.append((name, found))
        else:
            accepted.append(name)
    if accepted:
        return accepted
    if refused:
        raise _refusal(guest, "base_xml", refused)
    raise unreadable[0]


def policy_refusal(exc: DomainXmlPolicyError) -> ApiError:
    """The 422 for a refusal raised below the API (the placement service's renderer)."""
    return _refusal(exc.guest, "base_xml" if exc.what == "base_xml" else "xml", [(exc.host, list(exc.violations))])


def _refusal(guest: str, field: str, refused: list[tuple[str, list[Violation]]]) -> ApiError:
    what = "base_xml" if field == "base_xml" else "the rendered domain XML"
    if len(refused) == 1:
        host, found = refused[0]
        message = str(DomainXmlPolicyError(host, guest, what, found))
    else:
        message = f"guest {guest}: {what} refused by the domain XML policy of every candidate host: " + \
            "; ".join(f"host {host}: " + "; ".join(str(v) for v in found) for host, found in refused)
    details = [{"field": field, "host": host, **violation.to_dict()}
               for host, found in refused for violation in found]
    return ApiError(422, CODE, message, details)
