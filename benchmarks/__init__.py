"""Speed and fidelity benchmarks (not part of the timed test run; results in docs/).

A regular package, not a namespace one: a dependency (opacus) installs a top-level
``benchmarks`` package of its own into site-packages, which would otherwise shadow this folder.
"""
