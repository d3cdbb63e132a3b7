"""Routes, one module per resource; each exposes `router`."""
