"""The units and symbols the pages show, spelt once: a plan's objective and gains are the
rebalancer's objective (core/rebalance/whatif.py, docs/rebalance.md "Objective"), β is the
interference model's coefficient (docs/model.md); trials, repins and moves are the disruption
budget's (docs/disruption.md). Templates read them as globals."""

from __future__ import annotations

from vmplacer.core.rebalance.disruption import MIGRATION_REPINS

GAIN_UNIT = "guest-equivalents"
OBJECTIVE_TITLE = ("J = Σ over guests of weight × (predicted performance as a fraction of the guest's speed alone − "
                   "fairness penalty), in guest-equivalents at full speed: 1.000 is one guest of weight 1 running "
                   "as fast as alone")
GAIN_TITLE = ("the change of the plan's objective J this action brings, in guest-equivalents at full speed "
              "(+0.100: a tenth of one guest's speed alone won)")
PLAN_GAIN_TITLE = ("the host's newest plan with something to do: the change of the objective J the whole plan "
                   "predicts, in guest-equivalents at full speed, for every host it covers (the plan's page "
                   "splits it by action)")
BETA_TITLE = ("β: the interference model's coefficient, the fraction of a guest's performance a busy neighbour "
              "costs it at that distance (0.050: 5 %)")

# The disruption budget (docs/disruption.md): what a plan's trials spent, and a guest's moves.
TRIALS_TITLE = ("trials: layouts the plan tries after its moves and keeps only if Freeze'nSense measures them "
                "better; a group of small hosts tried together counts as one (rebalance.disruption.max_trials "
                "per plan)")
TRIAL_REPINS_TITLE = (f"trial repins: vCPUs the plan's trials repin, a migration in a group trial counting as "
                      f"{MIGRATION_REPINS} (rebalance.disruption.max_trial_repins per plan)")
WAITING_TITLE = ("trials waiting: offered but left for a later round because the plan's trials or trial repins "
                 "were spent; the next round offers them again")
MOVES_HOUR_TITLE = ("moves in the last hour: repins, memory moves and migrations of one guest finished in the last "
                    "60 minutes, from every process's stored plans; a move a trial or roll-back undid counts twice "
                    "(rebalance.disruption.max_moves_per_guest_hour; 0: no limit)")

GLOBALS = {"gain_unit": GAIN_UNIT, "objective_title": OBJECTIVE_TITLE, "gain_title": GAIN_TITLE,
           "plan_gain_title": PLAN_GAIN_TITLE,
           "beta_title": BETA_TITLE, "trials_title": TRIALS_TITLE, "trial_repins_title": TRIAL_REPINS_TITLE,
           "waiting_title": WAITING_TITLE, "moves_hour_title": MOVES_HOUR_TITLE}
