"""app/place: placing guests: the placement service, host choice over the fleet, group commit, the model's scorer."""
