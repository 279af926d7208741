"""A running scheduler at tcp:// or tls://: its TLS settings, a check that it answers as Dask does,
and a client once it has a worker."""

import contextlib
import threading

from distributed import Client

from metricpipe.tasks.errors import InputError

CONNECT_TIMEOUT = "10s"  # a scheduler address that does not answer within it is an input error


TLS_ENV = ("METRICPIPE_TLS_CA_FILE", "METRICPIPE_TLS_CERT", "METRICPIPE_TLS_KEY")


def tls_security(cluster: str, tls: tuple | None):
    """Dask's Security for a tls:// scheduler: the config's ``tls: {ca_file, cert, key}``, else the
    environment (METRICPIPE_TLS_CA_FILE, _CERT, _KEY), else Dask's own ``distributed.comm.tls``
    settings; encryption required. Missing or unreadable files are one line naming the setting."""
    import os

    from distributed.security import Security

    if tls is None and all(os.environ.get(k) for k in TLS_ENV):
        tls, where = tuple(os.environ[k] for k in TLS_ENV), "environment " + ", ".join(TLS_ENV)
    else:
        where = "config tls"
    if tls is None:
        sec = Security(require_encryption=True)
        if not (sec.tls_ca_file and sec.tls_client_cert):
            raise InputError(
                f"cluster {cluster}: a tls:// scheduler needs certificates; give tls: {{ca_file, cert, "
                f"key}} in the config or set {', '.join(TLS_ENV)}"
            )
        return sec
    for name, path in zip(("ca_file", "cert", "key"), tls):
        if not os.path.isfile(path):
            raise InputError(f"{path}: file not found ({where}: {name}); give the PEM file's path")
    return Security(tls_ca_file=tls[0], tls_client_cert=tls[1], tls_client_key=tls[2], require_encryption=True)


@contextlib.contextmanager
def scheduler_client(cluster: str, tls: tuple | None, wait_timeout: float):
    """A client of a running scheduler (tcp:// or tls://), once it answers and has a worker."""
    security = tls_security(cluster, tls) if cluster.startswith("tls://") else None
    try:
        check_scheduler(cluster, security, min(_seconds(CONNECT_TIMEOUT), wait_timeout))
        client = Client(cluster, timeout=CONNECT_TIMEOUT, security=security)
    except (OSError, TimeoutError) as e:
        raise InputError(
            f"cluster {cluster}: cannot reach the scheduler ({e}); start it with "
            f"'dask scheduler' or check the address" + (" and the tls certificates" if security else "")
        ) from None
    with client:
        try:
            client.wait_for_workers(1, timeout=wait_timeout)
        except TimeoutError:
            raise InputError(
                f"cluster {cluster}: no worker joined the scheduler within {wait_timeout:g} s "
                f"(wait_timeout); start one ('dask worker {cluster}') and run again, or raise "
                f"wait_timeout (--wait-timeout)"
            ) from None
        yield client


def _seconds(t) -> float:
    from dask.utils import parse_timedelta

    return parse_timedelta(t, "s")


def check_scheduler(address: str, security, timeout: float) -> None:
    """Connect to ``address`` and complete Dask's handshake within ``timeout`` seconds: OSError when
    nothing accepts the connection, InputError when what does is not a Dask scheduler. distributed
    bounds the TCP connect only (its handshake read has no timeout), so Client() at a port that
    accepts connections but does not speak Dask (a silent listener, an HTTP server) waited forever.
    Run in a thread of its own: this process may already run an event loop."""
    import asyncio
    import socket

    from distributed.comm import connect as comm_connect
    from distributed.comm.addressing import get_address_host_port

    with socket.create_connection(get_address_host_port(address), timeout=timeout):  # OSError: nothing accepts
        pass  # (first on its own: the handshake's bound below must not cut a slow connect short)
    args = security.get_connection_args("client") if security is not None else {}

    async def probe():
        comm = await comm_connect(address, timeout=timeout, **args)
        await comm.close()

    outcome = []

    def run():
        try:
            asyncio.run(asyncio.wait_for(probe(), timeout))
            outcome.append(None)
        except (asyncio.TimeoutError, TimeoutError):  # connected (a failed connect is an OSError)
            outcome.append(f"no Dask handshake within {timeout:g} s")
        except OSError as e:
            outcome.append(e)
        except Exception as e:  # noqa: BLE001 - whatever the port sent back: not a scheduler's answer
            outcome.append(f"its answer is not Dask's ({type(e).__name__})")

    t = threading.Thread(target=run, name="metricpipe-scheduler-check", daemon=True)
    t.start()
    t.join(timeout + 5)
    why = outcome[0] if outcome else f"no Dask handshake within {timeout:g} s"
    if isinstance(why, OSError):
        raise why
    if why is not None:
        raise InputError(
            f"cluster {address}: a program listens there but it is not a Dask scheduler ({why}); "
            f"check the address and port ('dask scheduler' prints its address)"
        )
