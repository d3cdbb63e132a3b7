"""`vmplacer rebalance`, `vmplacer apply PLAN_ID`, `vmplacer plans`, and `vmplacer plan --rebalance`.

    vmplacer plan --rebalance [--host H ... | --all] [--max-actions N] [--scope GLOB]   (dry run)
    vmplacer apply PLAN_ID [--wait 1m] [--on-failure continue|rollback] [--migration-timeout 10m]
    vmplacer rebalance [--dry-run] [--max-actions N] [--host H ... | --all] [--profile-seconds 10s]
                       [--[no-]share] [--batch-hosts N] [--round-rest DURATION]
    vmplacer rebalance --drain HOST [--reason TEXT] [--scope GLOB] [--yes]   (maintenance: empty HOST)
    vmplacer plans list [--all | --state S ...] [--limit N]     (`plans` alone: deprecated)
    vmplacer plans show PLAN_ID          (`plans PLAN_ID`: deprecated)
    vmplacer plans cancel PLAN_ID [--reason TEXT]

`rebalance` = profile → learn → plan → apply while holding a lease on every
host involved; a second run finds the hosts busy and exits without acting
(status "busy", exit 0 — a timer firing early is not an error) unless
`--wait` gives it time. A run that finds nothing to do stores an `empty`
plan (final), which `plans` leaves out unless asked (--all, --state empty).
Several instances running `rebalance --all` at once share the work (`--share`, the default when
several hosts are selected): each joins the round over those hosts and claims batches of
`--batch-hosts` hosts not done yet (leases taken atomically), plans and applies them, and goes
on until every host of the round is done once; hosts a stopped instance held are taken over
when their lease lapses. Migrations stay within a batch. `--no-share` plans every selected
host in one plan and finds them busy while another run holds any.
`plans cancel` stops a proposed or approved plan at once and a running one
before its next action (what is done stays done). `--drain HOST` puts HOST
in maintenance (no new guests, no migrations in) and plans the live
migrations of every guest on it instead of a rebalance; it asks first on a terminal and needs
`--yes` anywhere else (a plan only: `plan --rebalance --drain HOST`). A host the planner
refuses (a guest pinned to pCPUs its capabilities do not list) is left out of the plan and
named in a note (the guest, the pCPUs, where the host's pCPUs were read from), as a host that
cannot be read is. Exit codes: 0 done
(or nothing to do, or busy, or cancelled on request); 1 an action failed, a
drain left guests on its host, a host/database failed, or planning ran out of memory (one
line naming the hosts and the setting to lower, rebalance.search.memory_budget_mib); 2 bad input (an
unknown plan, or one whose state does not allow the command; an option the chosen mode
does not read, e.g. --cooldown with --drain or --migration-timeout with --dry-run; every host
of a plan, or the host to drain, refused by the planner: nothing is planned).

Durations (--cooldown, --backoff, --wait, --migration-timeout, --profile-seconds) take a unit
(500us, 10ms, 2.5s, 10m, 1h); a bare number is seconds.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from vmplacer.cli.common import (
    EXIT_OK,
    EXIT_OPERATIONAL,
    CliContext,
    DatabaseError,
    OperationalError,
    UsageError,
    add_format_argument,
    add_host_selection,
    count,
    duration,
    emit,
    operator_name,
    print_table,
    refuse_options,
    resolve_hosts,
    select_columns,
)
from vmplacer.cli.confirm import add_yes_argument, confirm
from vmplacer.cli.verbs import no_more_words, split_verb, words_anywhere
from vmplacer.core.text import plural

DEFAULT_PROFILE_SECONDS = 5.0
PLANS_COLUMNS = ("id", "state", "hosts", "actions", "summary")  # `plans list`
# a plan's actions: the main table of `plans show` and `plans cancel` (the before / after table stays whole)
PLAN_ACTION_COLUMNS = ("#", "action", "guest", "host", "change", "gain", "conf.", "after", "state",
                       "reason / outcome")
# Options of a rebalancing plan that a placement plan (`plan --request`) never reads, and back.
REBALANCE_PLAN_OPTIONS = ("drain", "reason", "max_actions", "scope", "min_gain", "cooldown", "backoff", "no_migrate",
                          "no_trials", "no_explore")
PLACEMENT_PLAN_OPTIONS = ("why", "ignore_maintenance", "domain_type", "hosts_to_score")
# What tunes a rebalance but not a drain (vmplacer.app.rebalance.rebalancer: make_plan, _profile_step).
NOT_FOR_DRAIN = ("max_actions", "cooldown", "backoff")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rebalance",
        help="profile, learn, plan and apply live repins/migrations (holds a lease per host)",
        description="One rebalancing run: Freeze'nSense profiling, model update, a plan of live repins and "
        "migrations that raise predicted performance, and its execution. Two runs never act on one host.",
    )
    add_policy_arguments(parser)
    parser.add_argument("--dry-run", action="store_true", help="stop after the plan (it is stored, as proposed)")
    parser.add_argument("--profile-seconds", type=duration(zero="skips profiling"), metavar="DURATION",
                        help="Freeze'nSense profiling per host before planning, e.g. 10s (default 5s; 0 skips)")
    parser.add_argument("--share", action=argparse.BooleanOptionalAction, default=None,
                        help="share the hosts with other instances running the same command: each joins one "
                             "round and claims batches of hosts until every host is done once (default: on "
                             "when several hosts are selected; --no-share plans all of them in one plan)")
    parser.add_argument("--batch-hosts", type=count(1), metavar="N",
                        help="with --share: hosts claimed, planned and applied together; migrations stay within "
                             "a batch (default 50, rebalance.rounds.batch_hosts)")
    parser.add_argument("--round-rest", type=duration(zero="none"), metavar="DURATION",
                        help="with --share: a round of the same hosts that finished this recently is not redone, "
                             "e.g. 5m for a timer firing every 10m on each instance (default 0)")
    add_executor_arguments(parser)
    add_format_argument(parser)
    parser.set_defaults(func=run_rebalance)

    apply = subparsers.add_parser("apply", help="apply a stored plan (proposed or approved)")
    apply.add_argument("plan_id", type=int, metavar="PLAN_ID",
                       help="the stored plan to apply (`vmplacer plans list` lists them)")
    add_executor_arguments(apply)
    add_format_argument(apply)
    apply.set_defaults(func=run_apply)

    plans = subparsers.add_parser(
        "plans", help="stored rebalancing plans: list, show ID, cancel ID",
        usage="vmplacer plans list [--all | --state STATE ...] [--limit N]\n"
              "                          [--format F]\n"
              "       vmplacer plans show PLAN_ID [--format F]\n"
              "       vmplacer plans cancel PLAN_ID [--reason TEXT] [--format F]",
        description="`list`: the newest plans (empty ones, where a run found nothing to do, are "
                    "left out unless --all or --state asks for them). `show PLAN_ID`: that plan (`plans` alone and "
                    "`plans PLAN_ID` still work this release, deprecated). `cancel PLAN_ID`: stop a proposed or approved plan at once, or a running one before "
                    "its next action (actions already done stay applied; a cancel is not a rollback).")
    plans.add_argument("words", nargs="*", metavar="[list | show PLAN_ID | cancel PLAN_ID]",
                       help="the action (left out, deprecated: list; a bare PLAN_ID shows that plan)")
    plans.add_argument("--limit", type=count(1), default=20, metavar="N", help="at most N plans (default 20)")
    which = plans.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="list plans in every state, empty ones included")
    which.add_argument("--state", action="append", metavar="STATE",
                       help="list only plans in this state (repeatable): " + ", ".join(_plan_states()))
    plans.add_argument("--reason", metavar="TEXT", help="with cancel: why (kept with the plan and in the audit log)")
    add_format_argument(plans, tables={"list": PLANS_COLUMNS, "show": PLAN_ACTION_COLUMNS,
                                       "cancel": PLAN_ACTION_COLUMNS}, command="plans")
    plans.set_defaults(func=run_plans)
    words_anywhere(plans, "words", PLANS_VERBS)


def _plan_states() -> tuple[str, ...]:
    from vmplacer.core.rebalance.plan import PLAN_STATES

    return PLAN_STATES


def add_policy_arguments(parser: argparse.ArgumentParser, *, host_group: bool = True) -> None:
    if host_group:
        add_host_selection(parser, default="all", verb="rebalance",
                           host_note=": no migrations to or from the hosts left out")
    parser.add_argument("--max-actions", type=count(0), metavar="N", help="at most N actions (default 8)")
    parser.add_argument("--scope", action="append", default=[], metavar="GLOB",
                        help="only guests matching may move (repeatable; the others still count as load)")
    parser.add_argument("--min-gain", type=float, metavar="G",
                        help="hysteresis: least predicted gain of a move, in VMs at full speed (default 0.05)")
    parser.add_argument("--cooldown", type=duration(zero="none"), metavar="DURATION",
                        help="a guest moved this recently stays put, e.g. 10m (default 10m; 0: none)")
    parser.add_argument("--backoff", type=duration(zero="off"), metavar="DURATION",
                        help="after k planned layouts of a host in a row measured worse, only try its layout "
                             "for DURATION·(2^(k-1)-1), e.g. 10m (default 0: off)")
    parser.add_argument("--no-migrate", action="store_true", help="repins only, no live migration")
    parser.add_argument("--no-trials", action="store_true",
                        help="no measured trials: take the planned layout without measuring it, try no other")
    parser.add_argument("--no-explore", action="store_true",
                        help="keep measured trials, but do not try layouts only to learn what the model "
                             "has not seen (exploration)")
    parser.add_argument("--drain", metavar="HOST",
                        help="maintenance: live-migrate every guest off HOST (it is put in maintenance first, "
                             "unless this is a dry run) instead of rebalancing")
    parser.add_argument("--reason", metavar="TEXT", help="with --drain: why HOST goes into maintenance")
    if host_group:  # `rebalance`, not `plan --rebalance` (a dry run, which changes nothing)
        add_yes_argument(parser, "with --drain (not --dry-run): do it without asking (needed when stdin is not "
                                 "a terminal; on a terminal a y/N question asks first, No exits 2)")


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", type=duration(zero="give up at once"), default=0.0, metavar="DURATION",
                        help="wait this long for hosts another run holds, e.g. 1m (default: give up at once)")
    parser.add_argument("--on-failure", choices=("continue", "rollback"), default="continue",
                        help="after a failed action: go on with the others, or undo everything done")
    parser.add_argument("--bandwidth", type=count(1), metavar="MIB_S", help="migration bandwidth limit, MiB/s")
    parser.add_argument("--migration-timeout", type=duration(), default=300.0, metavar="DURATION",
                        help="abort a migration after this long, e.g. 10m; the guest stays on its source "
                             "(default 5m)")


# ----- building ---------------------------------------------------------------------------------------
def settings_with_flags(args: argparse.Namespace, base: Any) -> Any:
    """The config file's `rebalance:` settings (`base`), with this run's flags on top."""
    from vmplacer.core.rebalance.state import RebalanceInputError

    values: dict[str, Any] = {}
    if getattr(args, "max_actions", None) is not None:
        values["max_actions"] = args.max_actions
    if getattr(args, "min_gain", None) is not None:
        values["min_gain"] = args.min_gain
    if getattr(args, "cooldown", None) is not None:
        values["cooldown_s"] = args.cooldown
    if getattr(args, "backoff", None) is not None:
        values["backoff_s"] = args.backoff
    if getattr(args, "no_migrate", False):
        values["allow_migration"] = False
    if getattr(args, "no_trials", False):
        values["trials"] = False
    if getattr(args, "no_explore", False):
        values["exploration"] = 0.0
    if getattr(args, "bandwidth", None):
        values["migration_bandwidth_mib_s"] = float(args.bandwidth)
    if getattr(args, "batch_hosts", None) is not None:
        values["round_batch_hosts"] = args.batch_hosts
    if getattr(args, "round_rest", None) is not None:
        values["round_rest_s"] = args.round_rest
    try:
        return replace(base, **values)
    except RebalanceInputError as exc:
        option = {"max_actions": "--max-actions", "min_gain": "--min-gain", "cooldown_s": "--cooldown",
                  "backoff_s": "--backoff"}
        named = next((o for f, o in option.items() if f in str(exc)), "option")
        raise UsageError(f"{named}: {exc}") from None


def _executor_settings(args: argparse.Namespace) -> Any:
    from vmplacer.app.apply.executor import ExecutorSettings

    return ExecutorSettings(migration_bandwidth_mib_s=args.bandwidth, migration_timeout_s=args.migration_timeout,
                            on_failure=args.on_failure)


def _rebalancer(ctx: CliContext, args: argparse.Namespace, *, executor: bool) -> Any:
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.bootstrap.rebalance import build_rebalancer

    container = ctx.container
    try:
        container.upgrade_database()
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    return build_rebalancer(
        container,
        settings=settings_with_flags(args, container.settings.rebalance),
        executor_settings=_executor_settings(args) if executor else None,
    )


def _hosts(args: argparse.Namespace, ctx: CliContext) -> tuple[str, ...] | None:
    """Hosts named by --host (one string from `plan`, a list from `rebalance`); None: every host."""
    chosen = getattr(args, "host", None)
    if not chosen:
        return None
    return tuple(resolve_hosts(ctx, [chosen] if isinstance(chosen, str) else chosen))


def _guarded(fn):  # noqa: ANN001, ANN202 - wraps the handlers' calls into the world
    from sqlalchemy.exc import SQLAlchemyError

    from vmplacer.app.rebalance.rebalancer import RebalanceError
    from vmplacer.ports import HypervisorError

    try:
        return fn()
    except RebalanceError as exc:
        if exc.bad_input:
            raise UsageError(str(exc)) from None
        raise OperationalError(str(exc)) from None
    except HypervisorError as exc:
        raise OperationalError(str(exc)) from None
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None


# ----- commands ----------------------------------------------------------------------------------------
def run_rebalance_plan(args: argparse.Namespace, ctx: CliContext) -> int:
    """`vmplacer plan --rebalance`: observe, plan, store as proposed, print. Nothing changes."""
    if getattr(args, "request", None):
        raise UsageError("--request: not used with --rebalance (the plan moves guests already running)")
    if getattr(args, "caps", None):
        raise UsageError("--caps: not used with --rebalance (it plans for live hosts)")
    refuse_options(args, PLACEMENT_PLAN_OPTIONS,
                   "applies to placement plans (plan --request), not to plan --rebalance")
    rebalancer = _rebalancer(ctx, args, executor=False)
    hosts = list(_hosts(args, ctx) or sorted(rebalancer.hosts))
    notes: list[str] = []
    scope = tuple(args.scope) or ("*",)
    drain = _drain_host(args, ctx)
    plan = _guarded(lambda: rebalancer.make_plan(hosts, max_actions=args.max_actions, scope=scope, notes=notes,
                                                 drain=drain))
    data = {"status": "planned" if plan.state == "proposed" else "nothing-to-do", "plan": plan.to_dict(),
            "notes": notes + _stuck_notes(plan) + _held_notes(plan)}
    emit(args, data, render_report)
    return EXIT_OK


def _drain_host(args: argparse.Namespace, ctx: CliContext) -> str | None:
    """The configured host `--drain` names (None without it); `--reason` only with it, and the
    options that tune a rebalance (gain, cool-down, back-off, action count, profiling) not with it."""
    if args.drain is None:
        refuse_options(args, ("reason",), "only with --drain HOST")
        return None
    refuse_options(args, NOT_FOR_DRAIN, "does not apply to a drain (--drain): every guest leaves the host, "
                   "whatever its gain, its last move or what was measured")
    if getattr(args, "profile_seconds", None):  # 0 says what a drain does anyway: no profiling
        raise UsageError("--profile-seconds: does not apply to a drain (--drain): it profiles nothing, every "
                         "guest leaves whatever it measures")
    if getattr(args, "no_migrate", False):
        raise UsageError("--no-migrate: a drain is made of live migrations")
    known = [h.name for h in ctx.settings.hosts]
    if args.drain not in known:
        raise UsageError(f"--drain {args.drain!r}: unknown host (configured: {', '.join(known)})")
    if len(known) < 2:
        raise UsageError(f"--drain {args.drain}: no other configured host to move its guests to")
    return args.drain


def _stuck_notes(plan: Any) -> list[str]:
    notes = plan.settings.get("notes") or {}
    if not notes.get("drain"):
        return []
    return [f"guest {entry}: stays on {notes['drain']}" for entry in notes.get("stuck", [])]


def _held_notes(plan: Any) -> list[str]:
    """Hosts in back-off: their planned layouts kept measuring worse, so their layout is only tried."""
    return list((plan.settings.get("notes") or {}).get("held") or [])


def _enter_maintenance(ctx: CliContext, host: str, reason: str | None) -> None:
    from sqlalchemy.exc import SQLAlchemyError

    uri = next(h.uri for h in ctx.settings.hosts if h.name == host)
    try:
        record, changed = ctx.container.maintenance.start(host, uri, by=operator_name(),
                                                          reason=(reason or "").strip() or "drain")
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    sys.stderr.write(("" if changed else "already: ") + record.describe() + "\n")


def run_rebalance(args: argparse.Namespace, ctx: CliContext) -> int:
    from vmplacer.app.rebalance.rebalancer import RunOptions

    drain = _drain_host(args, ctx)
    if args.dry_run:
        refuse_options(args, ("on_failure", "migration_timeout"),
                       "applies when a plan is carried out, not to rebalance --dry-run (the plan is only stored)")
    hosts = _hosts(args, ctx)
    share = _share(args, drain, len(hosts) if hosts is not None else len(ctx.settings.hosts))
    rebalancer = _rebalancer(ctx, args, executor=True)
    profile_seconds = DEFAULT_PROFILE_SECONDS if args.profile_seconds is None else args.profile_seconds
    options = RunOptions(
        hosts=hosts, dry_run=args.dry_run, max_actions=args.max_actions,
        scope=tuple(args.scope) or ("*",), profile_seconds=profile_seconds, wait_s=args.wait, drain=drain,
        share=share, batch_hosts=rebalancer.settings.round_batch_hosts,
        round_rest_s=rebalancer.settings.round_rest_s,
    )
    if drain is None or args.dry_run:
        refuse_options(args, ("yes",), "only for a real drain (--drain HOST without --dry-run), the one run "
                       "that asks first")
    elif hosts is not None and drain not in hosts:
        raise UsageError(f"host {drain} to drain is not among the hosts of this run ({', '.join(hosts)})")
    else:
        confirm(args, "rebalance --drain", f"put host {drain} in maintenance and live-migrate every guest off it")
    if drain is not None and not args.dry_run:
        _enter_maintenance(ctx, drain, args.reason)  # first: nothing new lands while it empties
    report = _guarded(lambda: rebalancer.run(options))
    stuck = _stuck_notes(report.plan) if report.plan is not None else []
    report.notes.extend(stuck + (_held_notes(report.plan) if report.plan is not None else []))
    emit(args, report.to_dict(), render_report)
    if report.status == "failed" or (stuck and report.status in ("applied", "nothing-to-do")):
        return EXIT_OPERATIONAL
    return EXIT_OK


def _share(args: argparse.Namespace, drain: str | None, selected: int) -> bool:
    """Whether this run shares its hosts with other instances in a round: asked for, or by
    default when several hosts are selected; never for a drain (one host, moved as a whole)."""
    if drain is not None:
        if args.share:
            raise UsageError("--share: does not apply to a drain (--drain): it plans one host's guests as a whole")
        refuse_options(args, ("batch_hosts", "round_rest"), "only when the run shares its hosts (--share), not "
                       "with --drain")
        return False
    if args.share is False:
        refuse_options(args, ("batch_hosts", "round_rest"), "only when the run shares its hosts, not with --no-share")
        return False
    share = bool(args.share) or selected > 1
    if not share:
        refuse_options(args, ("batch_hosts", "round_rest"), "only when the run shares its hosts (several hosts "
                       "selected, or --share)")
    return share


def run_apply(args: argparse.Namespace, ctx: CliContext) -> int:
    rebalancer = _rebalancer(ctx, args, executor=True)
    plan = _guarded(lambda: rebalancer.apply(args.plan_id, wait_s=args.wait))
    emit(args, {"status": plan.state, "plan": plan.to_dict(), "notes": []}, render_report)
    return EXIT_OK if plan.state in ("succeeded", "cancelled") else EXIT_OPERATIONAL


PLANS_VERBS = ("list", "show", "cancel")


def _plan_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"PLAN_ID: must be a plan number (or an action: {', '.join(PLANS_VERBS)}), "
                         f"got {text!r}") from None
    if value < 1:
        raise UsageError(f"PLAN_ID: must be a positive plan number, got {value}")
    return value


def run_plans(args: argparse.Namespace, ctx: CliContext) -> int:
    """`plans list`, `plans show PLAN_ID`, `plans cancel PLAN_ID [--reason TEXT]`."""
    verb, rest = split_verb("plans", args.words, PLANS_VERBS, bare="list", other="show")
    if verb == "list":
        no_more_words("plans", "list", rest, f" (`vmplacer plans show {rest[0]}` shows one plan)" if rest else "")
    elif len(rest) != 1:
        example = "12 --reason \"...\"" if verb == "cancel" else "12"
        raise UsageError(f"plans {verb}: give exactly one PLAN_ID, e.g. `vmplacer plans {verb} {example}`")
    select_columns(args, verb)
    cancel = verb == "cancel"
    plan_id = _plan_id(rest[0]) if rest else None
    if not cancel:
        refuse_options(args, ("reason",), "only with `plans cancel PLAN_ID`")
    if plan_id is not None:
        refuse_options(args, ("all", "state", "limit"), "only when listing plans (`plans list`)")
    unknown = sorted(set(args.state or ()) - set(_plan_states()))
    if unknown:
        raise UsageError(f"--state {unknown[0]!r}: not a plan state (one of {', '.join(_plan_states())})")

    from sqlalchemy.exc import SQLAlchemyError

    container = ctx.container
    try:
        container.upgrade_database()
    except SQLAlchemyError as exc:
        raise DatabaseError(exc) from None
    store = container.plan_store
    if cancel:
        return _cancel(args, store, container, plan_id)  # type: ignore[arg-type]
    if plan_id is not None:
        plan = _guarded(lambda: store.get(plan_id))
        if plan is None:
            raise UsageError(f"PLAN_ID: plan {plan_id} does not exist")
        emit(args, {"status": plan.state, "plan": plan.to_dict(), "notes": []}, render_report)
        return EXIT_OK
    if args.all:
        states = None
    elif args.state:
        states = list(dict.fromkeys(args.state))
    else:
        states = [s for s in _plan_states() if s != "empty"]
    rows = _guarded(lambda: store.recent(args.limit, states=states))
    hidden = "" if args.all or args.state else " (empty ones hidden: --all shows them)"
    emit(args, rows, lambda d: print_table(f"rebalancing plans{hidden}", PLANS_COLUMNS,
                                           [(r["id"], r["state"], ",".join(r["hosts"]), r["actions"], r["summary"])
                                            for r in d]))
    return EXIT_OK


def _cancel(args: argparse.Namespace, store: Any, container: Any, plan_id: int) -> int:
    from vmplacer.app.rebalance.rebalancer import cancel_plan

    outcome = _guarded(lambda: cancel_plan(store, plan_id, by=operator_name(), reason=args.reason or "",
                                           audit=container.placement_store))
    notes = []
    if outcome.status == "cancel-requested":
        notes.append(f"plan {plan_id} is running: it stops before its next action; actions already done stay "
                     f"applied (`vmplacer plans show {plan_id}` shows the outcome)")
    emit(args, {"status": outcome.status, "plan": outcome.plan.to_dict(), "notes": notes}, render_report)
    return EXIT_OK


# ----- output -----------------------------------------------------------------------------------------------
def render_report(data: dict[str, Any]) -> None:
    for step in data.get("steps", []):
        print(f"{step['name']}: {step['status']} ({step['seconds']:.1f} s) {step['message']}")
    plan = data.get("plan")
    if plan is None:
        for note in data.get("notes", []):
            print(note)
        print(f"status: {data['status']}")
        return
    disruption = disruption_line(plan)
    if not plan["actions"]:
        print(f"plan {plan['id']} ({plan['state']}): {plan['summary']}")
        if disruption:
            print(disruption)
        _render_outcome(plan)
        for note in data.get("notes", []):
            sys.stderr.write(f"note: {note}\n")
        print(f"status: {data['status']}")
        return
    print_table(
        f"plan {plan['id']} ({plan['state']}): {plan['summary']}",
        PLAN_ACTION_COLUMNS,
        [(a["index"], a["kind"] + (" (tried)" if a["parameters"].get("tried") else ""), a["guest"] or "", _where(a),
          action_change_text(a), f"{a['predicted_gain']:+.3f}",
          f"{a['confidence']:.2f}", ",".join(map(str, a["depends_on"])), a["state"],
          a["message"] or a["reason"]) for a in plan["actions"]],
    )
    if plan["diff"]:
        print_table("before / after", ("guest", "host", "pinning before", "pinning after", "predicted perf"),
                    [(d["guest"], d["host_before"] if d["host_before"] == d["host_after"]
                      else f"{d['host_before']} → {d['host_after']}", d["pins_before"], d["pins_after"],
                      _perf(d)) for d in plan["diff"]])
    if disruption:
        print(disruption)
    _render_outcome(plan)
    for note in data.get("notes", []):
        sys.stderr.write(f"note: {note}\n")
    print(f"status: {data['status']}")


WAITING_HOSTS_SHOWN = 5  # hosts of waiting trials the disruption line names before "…"


def disruption_line(plan: dict[str, Any]) -> str:
    """What the plan's trials spent of the disruption budget, from its notes (docs/disruption.md):
    "disruption: 2 of 20 trials kept, 96 of 400 trial repins; 3 trials waiting: h1, h2, h3"; ""
    for a plan whose notes hold none (a drain, a plan made before the budget)."""
    notes = (plan.get("settings") or {}).get("notes")
    notes = notes if isinstance(notes, dict) else {}
    spent = notes.get("disruption")
    if not isinstance(spent, dict) or not spent:
        return ""
    line = (f"disruption: {spent.get('trials', '?')} of {spent.get('max_trials', '?')} trials kept, "
            f"{spent.get('trial_repins', '?')} of {spent.get('max_trial_repins', '?')} trial repins")
    waiting = spent.get("trials_waiting") or 0
    if not waiting:
        return line + "; no trial waiting"
    hosts = sorted({str(h) for entry in notes.get("over_budget") or () if isinstance(entry, dict)
                    for h in entry.get("hosts") or ()})
    named = ", ".join(hosts[:WAITING_HOSTS_SHOWN]) + (" …" if len(hosts) > WAITING_HOSTS_SHOWN else "")
    return line + f"; {plural(waiting, 'trial')} waiting" + (f" on {named}" if named else "")


def _render_outcome(plan: dict[str, Any]) -> None:
    request = plan.get("cancel_request")
    if request and plan["state"] == "running":
        print(f"cancel requested by {request['by']}" + (f": {request['reason']}" if request["reason"] else "")
              + " (stops before its next action)")
    elif plan["message"] and plan["state"] in ("cancelled", "failed", "rolled_back", "succeeded"):
        print(f"outcome: {plan['message']}")


def _where(action: dict[str, Any]) -> str:
    return f"{action['host']} → {action['target_host']}" if action["target_host"] else action["host"]


def action_change_text(action: dict[str, Any]) -> str:
    from vmplacer.core.placement.guest_placement import placement_from_dict

    if action["kind"] == "probe":
        trial = action["parameters"].get("trial")
        judged = f", {trial.get('kind')} trial" if isinstance(trial, dict) else ""
        hosts = trial.get("hosts") if isinstance(trial, dict) else None
        if isinstance(hosts, list) and len(hosts) > 1:
            judged += f" of {' + '.join(str(h) for h in hosts)} together"
        return f"Freeze'nSense {action['parameters'].get('seconds', '')} s{judged}"
    if action["kind"] in ("throttle", "release"):
        from vmplacer.core.placement.bandwidth import CpuBandwidth

        parameters = action["parameters"]
        shares = [CpuBandwidth.from_dict(parameters[k]).share for k in ("bandwidth_before", "bandwidth_after")]
        protects = f" for {parameters['protects']}" if parameters.get("protects") else ""
        return f"CPU share {shares[0]:.2f} → {shares[1]:.2f}{protects}"
    before, after = placement_from_dict(action["before"]), placement_from_dict(action["after"])
    if action["kind"] == "migrate":
        return "live migration"
    if action["kind"] == "set_memory_nodes":
        return f"mem {sorted(before.memory_nodes)} → {sorted(after.memory_nodes)}"
    return f"{before.describe_pinning()} → {after.describe_pinning()}"


def _perf(diff: dict[str, Any]) -> str:
    if diff["perf_before"] is None or diff["perf_after"] is None:
        return ""
    return f"{diff['perf_before']:.2f} → {diff['perf_after']:.2f}"
