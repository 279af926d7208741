"""What every stage receives: the client, the store, the config, and helpers to submit and gather
tasks with progress and errors that name the stage and the block."""
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from distributed import Client, as_completed

from pipeline.config import RunConfig
from pipeline.errors import StageError
from pipeline.storage import Store
from tasks.errors import InputError

RETRIES = 2  # tasks are pure and seeded, so a retry after a lost worker gives the identical result


@dataclass
class StageContext:
    client: Client
    store: Store
    config: RunConfig
    resume: bool = True
    log: Callable[[str], None] = print
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def submit(self, fn, *args, name: str, **kwargs):
        """Submit one task; ``name`` shows on the dashboard (one bar per kind of task)."""
        return self.client.submit(fn, *args, key=f"{name}-{self.run_id}-{uuid.uuid4().hex[:6]}",
                                  retries=RETRIES, pure=False, **kwargs)

    def gather(self, futures: list, stage: str, labels: list[str] | None = None) -> list:
        """Wait for ``futures`` showing progress; return results in submission order.

        A failure is re-raised at once: bad input as the worker's one-line InputError, anything else
        as a StageError naming the stage and the block; the remaining tasks are cancelled.
        """
        labels = labels or [f"task {i}" for i in range(len(futures))]
        where = {f.key: lab for f, lab in zip(futures, labels)}
        total, done, last = len(futures), 0, time.monotonic()
        try:
            for fut in as_completed(futures):
                if fut.status == "error":
                    exc = fut.exception()
                    if isinstance(exc, InputError):
                        raise exc
                    raise StageError(f"stage {stage} failed on {where[fut.key]}: "
                                     f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc
                done += 1
                if time.monotonic() - last > 5 or done == total and total > 4:
                    self.log(f"  {stage}: {done}/{total} tasks done")
                    last = time.monotonic()
        except BaseException:
            self.client.cancel(futures)
            raise
        return [f.result() for f in futures]
