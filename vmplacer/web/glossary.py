"""The units and symbols the pages show, spelt once: a plan's objective and gains are the
rebalancer's objective (core/rebalance/whatif.py, docs/rebalance.md "Objective"), β is the
interference model's coefficient (docs/model.md). Templates read them as globals."""

from __future__ import annotations

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

GLOBALS = {"gain_unit": GAIN_UNIT, "objective_title": OBJECTIVE_TITLE, "gain_title": GAIN_TITLE,
           "plan_gain_title": PLAN_GAIN_TITLE,
           "beta_title": BETA_TITLE}
