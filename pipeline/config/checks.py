"""Checks of single settings that the config and the command line share: the store's location, the
cluster's address, a local worker's memory, paths as workers open them."""

import os
import re
from pathlib import Path

from metricpipe.errors import ConfigError
from metricpipe.tasks.validate import whole_number


def absolute_path(p: str | None, base_dir: Path | None = None) -> str | None:
    """``p`` as workers open it: ``~`` expanded and, when relative, read against ``base_dir`` (a
    config's folder; default the working directory), since a worker runs in a folder of its own,
    perhaps on another machine. URLs (s3://...) and None are returned as they are."""
    if p is None or "://" in p:
        return p
    q = Path(os.path.expanduser(p))
    return str(q if q.is_absolute() else (base_dir or Path.cwd()) / q)


MIN_MEMORY_LIMIT = 400e6  # bytes: a worker holds ~250 MB after its imports, and Dask pauses it at 80%


def check_memory_limit(v, where: str):
    """'auto', a size string (2GB) or a positive byte count; anything else is refused here, not by Dask."""
    from dask.utils import parse_bytes

    v = whole_number(v)  # memory_limit: 2e9
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise ConfigError(f"{where}: memory_limit: expected a size such as 2GB or 'auto', got {v!r}")
    if v == "auto":
        return v
    try:
        n = parse_bytes(v) if isinstance(v, str) else v
    except (ValueError, TypeError, OverflowError):  # OverflowError: 1e400GB, an infinite size
        n = None
    if n is None or n <= 0:
        raise ConfigError(f"{where}: memory_limit: expected a positive size such as 2GB or 'auto', got {v!r}")
    if n < MIN_MEMORY_LIMIT:
        raise ConfigError(
            f"{where}: memory_limit: expected at least {MIN_MEMORY_LIMIT / 1e6:.0f}MB per worker (a "
            f"worker process holds ~250 MB before any task, and Dask pauses it at 80% of its limit), "
            f"got {v!r} ({n:,} bytes); e.g. 2GB"
        )
    return v


def check_local_memory(cluster: str, memory_limit, where: str) -> None:
    """A local cluster's memory_limit above this machine's memory is refused (Dask would silently use
    the machine's instead, and the memory rule would believe the larger figure). Checked whenever a
    RunConfig is made, so the config file and --memory-limit / --cluster local are checked alike;
    ``where`` names the setting (the file's key or the option)."""
    if cluster != "local" or memory_limit == "auto":
        return
    from dask.utils import format_bytes, parse_bytes
    from distributed.system import MEMORY_LIMIT  # the machine's, or its cgroup's / rlimit's when lower

    n = parse_bytes(memory_limit) if isinstance(memory_limit, str) else memory_limit
    if n > MEMORY_LIMIT:
        raise ConfigError(
            f"{where}: {memory_limit} per worker is more than this machine's memory "
            f"({format_bytes(MEMORY_LIMIT)}); give a smaller size (e.g. 2GB) or auto"
        )


def dashboard_address(v, where: str) -> str | None:
    """The local dashboard's [HOST]:PORT (a port number alone is ``:PORT``), or None for false / null."""
    if v is False or v is None:
        return None  # no dashboard
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 65536:
        return f":{v}"
    if not isinstance(v, str) or not re.fullmatch(r"[\w.\-\[\]:]*:\d{1,5}", v) or int(v.rpartition(":")[2]) > 65535:
        raise ConfigError(
            f"{where}: dashboard: expected [HOST]:PORT (e.g. :8787 or 127.0.0.1:0), a port number or false, got {v!r}"
        )
    if any(c in v.rpartition(":")[0] for c in "[]:"):  # Dask splits at every ':'
        raise ConfigError(
            f"{where}: dashboard: an IPv6 host ({v!r}) is not supported by Dask's dashboard address; "
            f"give 0.0.0.0:PORT to open it to the network, 127.0.0.1:PORT or :PORT (this machine "
            f"only), or false"
        )
    return v


def check_cluster(cluster: str, where: str) -> None:
    """local, tcp:// or tls:// scheduler addresses, or a cluster spec .yaml; ucx:// is refused."""
    if cluster.startswith("ucx://"):
        raise ConfigError(
            f"{where}: ucx:// is not supported (metricpipe moves row-blocks through the store, "
            f"not the comm); use tcp:// or tls://"
        )
    if cluster != "local" and not cluster.startswith(("tcp://", "tls://")) and not cluster.endswith((".yaml", ".yml")):
        raise ConfigError(
            f"{where}: expected local, tcp://HOST:PORT, tls://HOST:PORT or a cluster spec .yaml, got {cluster!r}"
        )


# What a store can be besides a local directory: S3 (tested on moto), GCS and Azure (the same lock without
# conditional writes; see the README). Any other fsspec protocol is read-only (http, zip, github), has no
# lock (ftp, hdfs) or was never tried: refused.
STORE_SCHEMES = ("file", "s3", "gs", "gcs", "az", "abfs", "abfss")


def check_store_url(store: str, where: str) -> None:
    """Refuse store locations that would write somewhere the user did not mean: the one check of a
    store's name, made by :class:`metricpipe.store.Store` and for the config's ``store`` / --store."""
    check_no_nul(store, where)
    if not store.strip():
        raise ConfigError(f"{where}: empty; give a directory (e.g. runs/digits) or an fsspec URL (s3://bucket/run)")
    if "::" in store:
        raise ConfigError(
            f"{where}: {store!r} is a chained fsspec URL (::), which stores cannot use; give one directory or URL"
        )
    if store.startswith("memory://"):
        raise ConfigError(
            f"{where}: {store!r} is in-memory, invisible to the workers (other processes); give a "
            f"directory or a shared URL such as s3://bucket/run"
        )
    _check_scheme(store, where)


def _check_scheme(store: str, where: str) -> None:
    from fsspec.registry import known_implementations

    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):(//)?(.*)", store, re.S)
    if not m or (not m.group(2) and m.group(1).lower() not in known_implementations):
        return  # a local path (one named run:1 included)
    scheme, slashes, rest = m.groups()
    fix = "give a local directory or s3://BUCKET/PREFIX"
    if scheme not in STORE_SCHEMES:
        if scheme.lower() in STORE_SCHEMES:
            raise ConfigError(
                f"{where}: {store!r}: URL schemes are lower case here; write "
                f"{scheme.lower()}://{rest if slashes else rest.lstrip('/')}"
            )
        raise ConfigError(
            f"{where}: {store!r}: {scheme}:// cannot hold a store (metricpipe keeps them in local "
            f"folders, S3, GCS or Azure); {fix}"
        )
    if not slashes:  # fsspec reads s3:/bucket/x as a local folder named s3:
        raise ConfigError(
            f"{where}: {store!r} is neither a URL ({scheme}: takes //) nor meant as a local folder; "
            f"write {scheme}://{rest.lstrip('/')}"
        )
    if scheme != "file" and not rest.split("/")[0]:
        raise ConfigError(f"{where}: {store!r} names no bucket; give {scheme}://BUCKET/PREFIX")


def check_no_nul(value: str, where: str) -> None:
    """A NUL byte ends a path for the operating system (Python refuses it with a ValueError)."""
    if "\0" in value:
        raise ConfigError(f"{where}: {value!r} holds a NUL byte (\\0), which no file name can; remove it")
