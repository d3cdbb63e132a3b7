"""app/rebalance: a rebalancing run end to end: lease, profile, learn, observe, plan, apply, release."""
