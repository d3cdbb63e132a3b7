"""Request field types for caller text: each refusal names its rule.

Everything a caller types reaches libvirt (`lookupByName` cannot carry a NUL
or an unpaired surrogate), the database or the audit log, so the rules are
checked in the schema, before a route runs: a refusal is a 422 naming the
field (`vms.0`) and the rule, never a 500 from below.

- `DomainName`: the name of a libvirt domain vmplacer did not necessarily
  create (profiling targets): 1-251 bytes of UTF-8 (a persistent domain's
  configuration is the file NAME.xml, and file names stop at 255 bytes), no
  '/' (it would be a directory in that file name), no control characters.
- `FreeText`: reasons and patterns: the control-character rule of labels.
- `LabelFilter`: `KEY=VALUE` in a list's query, by the rules of guest labels.
- `whole_number`: an integer field of a strict body takes `4.0` as 4 (JSON has one number
  type, and JSON Schema's `integer` is any number without a fractional part), never `"4"`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError

from vmplacer.api.errors import ApiError
from vmplacer.core.placement.guest import LABEL_KEY_RE, MAX_LABEL_VALUE
from vmplacer.core.text import CONTROL_RULE, control_problem, first_forbidden

DOMAIN_NAME_MAX_BYTES = 251
DOMAIN_NAME_RULE = (f"a libvirt domain name is 1-{DOMAIN_NAME_MAX_BYTES} bytes of UTF-8 with no '/' and "
                    f"{CONTROL_RULE}")
# The rules for clients reading the schema (ECMA-262 regular expressions). Surrogates and
# noncharacters are left out: without the `u` flag a pattern cannot name them portably, and
# no JSON encoder produces them from text; the validators above refuse them all the same.
DOMAIN_NAME_PATTERN = r"^[^\x00-\x1f\x7f-\x9f/]+$"
FREE_TEXT_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"


def whole_number(value: Any) -> Any:
    """A float without a fractional part as the integer it is; anything else as it came (the
    strict integer check then refuses it, naming the field)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _refuse(rule: str, problem: str) -> PydanticCustomError:
    return PydanticCustomError(rule, "{problem}", {"problem": problem})


def check_free_text(value: str) -> str:
    problem = control_problem(value)
    if problem is not None:
        raise _refuse("control_characters", problem)
    return value


def check_domain_name(value: str) -> str:
    found = first_forbidden(value)
    if found is not None:
        position, char = found
        raise _refuse("domain_name", f"U+{ord(char):04X} at position {position} is not allowed: {DOMAIN_NAME_RULE}")
    if "/" in value:
        raise _refuse("domain_name", f"'/' is not allowed: {DOMAIN_NAME_RULE}")
    size = len(value.encode("utf-8"))
    if not 1 <= size <= DOMAIN_NAME_MAX_BYTES:
        raise _refuse("domain_name", f"{size} bytes is not allowed: {DOMAIN_NAME_RULE}")
    return value


DomainName = Annotated[str, AfterValidator(check_domain_name),
                       Field(min_length=1, max_length=DOMAIN_NAME_MAX_BYTES,
                             json_schema_extra={"pattern": DOMAIN_NAME_PATTERN})]


Glob = Annotated[str, AfterValidator(check_free_text),
                 Field(min_length=1, max_length=255, json_schema_extra={"pattern": FREE_TEXT_PATTERN})]
Reason = Annotated[str, AfterValidator(check_free_text),
                   Field(max_length=1000, json_schema_extra={"pattern": FREE_TEXT_PATTERN})]
SelectorText = Annotated[str, AfterValidator(check_free_text),
                         Field(max_length=200, json_schema_extra={"pattern": FREE_TEXT_PATTERN})]
SpecText = Annotated[str, AfterValidator(check_free_text),
                     Field(max_length=255, json_schema_extra={"pattern": FREE_TEXT_PATTERN})]


def check_spec_value(value: str | int) -> str | int:
    if isinstance(value, str):
        if len(value) > 255:
            raise _refuse("string_too_long", f"{len(value)} characters is not allowed: at most 255")
        check_free_text(value)
    return value


SpecValue = Annotated[str | int, AfterValidator(check_spec_value)]


LABEL_FILTER_PATTERN = (LABEL_KEY_RE.pattern.rstrip("$") + r"=[^\x00-\x1f\x7f-\x9f]{1,%d}$" % MAX_LABEL_VALUE)
LABEL_FILTER_HELP = ("KEY=VALUE: only guests labelled so (repeatable: every one must match); KEY as guest label "
                     "names are (1-63 of A-Z a-z 0-9 _ . / -, starting with a letter or digit), VALUE "
                     f"1-{MAX_LABEL_VALUE} characters, {CONTROL_RULE}")
LabelFilter = Annotated[str, Field(min_length=3, max_length=64 + MAX_LABEL_VALUE, pattern=LABEL_FILTER_PATTERN)]


def label_filter(items: list[str]) -> dict[str, str]:
    """`KEY=VALUE` filters as a mapping; what the pattern cannot say (characters beyond it, one
    key asked with two values) is a 422 naming `query.label` and the rule."""
    labels: dict[str, str] = {}
    for item in items:
        key, _, value = item.partition("=")
        reason = control_problem(value)
        if reason is None and labels.get(key, value) != value:
            reason = f"label {key} asked with two values ({labels[key]!r}, {value!r}): no guest has both"
        if reason is not None:
            raise ApiError(422, "validation", f"field query.label: {reason}",
                           [{"field": "query.label", "rule": "label_filter", "reason": reason}])
        labels[key] = value
    return labels
