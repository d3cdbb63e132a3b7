"""app/observe: reading hosts and guests: host snapshots, Freeze'nSense (profiler and freezer), reconciling records."""
