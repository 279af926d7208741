"""metricpipe orchestration: config, CLI, stage graph, storage, cluster and report.

This layer wires `tasks` kernels to storage and the cluster; it holds no maths.
"""
__version__ = "0.1.0"
