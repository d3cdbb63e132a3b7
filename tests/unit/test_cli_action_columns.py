"""`--columns` on commands whose actions print different tables (`plans`, `profile`, `protect`):
parsing only reads the names; `select_columns` holds them to the main table of the action the
words chose, or refuses them where that action has none, before the action runs."""

from __future__ import annotations

import argparse

import pytest

from vmplacer.cli.common import UsageError, column_key, select_columns
from vmplacer.cli.profile import RESULT_COLUMNS, SHOW_COLUMNS
from vmplacer.cli.protect import PROTECTED_COLUMNS
from vmplacer.cli.rebalance import PLAN_ACTION_COLUMNS, PLANS_COLUMNS

ACTIONS = [(["plans"], "list", PLANS_COLUMNS), (["plans", "list"], "list", PLANS_COLUMNS),
           (["plans", "show", "3"], "show", PLAN_ACTION_COLUMNS), (["plans", "cancel", "3"], "cancel", PLAN_ACTION_COLUMNS),
           (["profile", "show", "vm1"], "show", SHOW_COLUMNS), (["profile", "run"], "run", RESULT_COLUMNS),
           (["protect", "status"], "status", PROTECTED_COLUMNS)]


def _args(argv: list[str]) -> argparse.Namespace:
    from vmplacer.cli.main import build_parser

    return build_parser(argv).parse_args(argv)


@pytest.mark.parametrize(("argv", "action", "headers"), ACTIONS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_the_names_are_the_actions_main_table(argv, action, headers):
    keys = [column_key(header) for header in headers]
    args = _args([*argv, "--columns", ",".join(reversed(keys))])
    assert args.columns == tuple(reversed(keys))  # names only, until the action is known
    select_columns(args, action)
    assert args.columns == tuple(reversed(headers)) and args.table_columns == headers
    args = _args([*argv, "--columns", f"{headers[-1]},{keys[-1]}"])  # as the header reads; once each
    select_columns(args, action)
    assert args.columns == (headers[-1],)
    unset = _args(argv)
    select_columns(unset, action)
    assert unset.columns is None


@pytest.mark.parametrize(("argv", "action", "headers"), ACTIONS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_name_the_table_lacks_is_refused_naming_its_columns(argv, action, headers):
    args = _args([*argv, "--columns", f"{column_key(headers[0])},no-such-column"])
    with pytest.raises(UsageError) as refused:
        select_columns(args, action)
    command = argv[0]
    assert str(refused.value) == (f"argument --columns: unknown column 'no-such-column' for `{command} {action}` "
                                  f"(columns: {', '.join(column_key(h) for h in headers)})")


def test_an_action_without_a_main_table_refuses_columns():
    args = _args(["profile", "replay", "--columns", "vm"])
    with pytest.raises(UsageError, match=r"^argument --columns: `profile replay` prints no single main table to "
                                         r"choose columns of \(--columns applies to `profile run`, `profile show`\)$"):
        select_columns(args, "replay")


@pytest.mark.parametrize("text", ["", ",", "a,,b"])
def test_empty_names_are_refused_when_parsed(text, capsys):
    with pytest.raises(SystemExit) as exit_:
        _args(["plans", "show", "3", "--columns", text])
    assert exit_.value.code == 2
    assert "argument --columns" in capsys.readouterr().err


def test_unicode_and_index_headers_have_keyboard_names():
    assert column_key("ζ/ζb") == "zeta-zetab" and column_key("ζb p50") == "zetab-p50"
    assert column_key("#") == "index" and column_key("conf.") == "conf"
    assert column_key("mean ± 95% CI") == "mean-95-ci"
