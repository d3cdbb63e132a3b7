"""The evaluation lab: a simulated cluster, its proven optimum and the evaluations run on it.

Kept apart from the product so that what vmplacer ships to manage real hosts never
depends on the simulator. Only `vmplacer eval` (imported inside its handlers),
the benchmarks and the tests import it; it may import core, ports, app and adapters.
"""
