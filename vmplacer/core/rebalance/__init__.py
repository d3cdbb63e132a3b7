"""core/rebalance: rebalancing: the what-if layouts, the search and its stages, plans and trials."""
