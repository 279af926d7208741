"""``metricpipe plan CONFIG``: what a run of CONFIG will train and roughly how long it takes, before
any work: the data's header and labels are read (as a run reads them first), nothing is staged, no
cluster starts and the store is not written."""

from metricpipe import stages
from metricpipe.checks import check_methods
from metricpipe.config import RunConfig
from metricpipe.estimate import entry_lines, estimate, fit_lines, footer, header
from metricpipe.store import Store


def plan_lines(cfg: RunConfig, rate: float | None = None, log=print) -> list[str]:
    """The plan of a run of ``cfg``: the data and the machine's rate, every fit (each config entry's
    candidates and refit, per repeat) with its estimated time, each entry's total, the stages' times
    and the run's. ``rate``: multiply-adds per second per core (None: time a GEMM now). Notes on the
    config (what the data's shape changes) go to ``log``."""
    data = stages.prepare_data(cfg, Store(cfg.store))
    cfg = check_methods(cfg, data.info, log)
    est = estimate(cfg, data.info, rate)
    return [*header(est), "", *fit_lines(est), "", "Per config entry:", *entry_lines(est), "", *footer(est)]
