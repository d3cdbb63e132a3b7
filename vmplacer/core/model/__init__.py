"""core/model: the interference model: measurements, fitting, identities, what it predicts."""
