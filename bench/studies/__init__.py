"""Studies: measurements that chose between alternatives once (a default, a rule, a
crossover), kept so that the choice can be measured again.

They are not registered in :data:`bench.run.BENCHMARKS` (no README or docs claim rests on
them alone and ``make bench`` does not run them); each runs as ``python -m
bench.studies.<name>`` and says in its docstring what it compares. Their tables stay in
``bench/results/<machine>/``, where the docs link them.
"""
