"""The local scheduler's dashboard: where it listens, the link printed for it, and Dask's warning
about a taken port and the log records of a viewer who left kept quiet."""

import contextlib
import errno
import ipaddress
import logging

from metricpipe.tasks.errors import InputError


def dashboard_address(dashboard: str | None) -> str | None:
    """Where the local dashboard listens: 127.0.0.1 unless the config names a host (``0.0.0.0:8787``
    opens it to the network deliberately); a taken port is swapped for a free one here, so Dask does
    not warn about it (the link printed is the real one)."""
    if dashboard is None:
        return None
    host, _, port = dashboard.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if port != "0" and not _port_free(host, int(port)):
        port = "0"
    return f"{host}:{port}"


def dashboard_lines(client) -> list[str]:
    """``Dashboard: LINK`` for where the dashboard really listens, and a warning line when that is every
    interface of this machine; none when there is no dashboard.

    Dask's own link names the scheduler's host (127.0.0.1 for a local cluster) whatever the dashboard
    binds, so ``0.0.0.0:8791`` or ``0:8787`` printed a loopback link for a dashboard open to the
    network. A scheduler that runs in this process (a local or SLURM cluster) says where its dashboard
    listens; a remote one's link is Dask's."""
    from distributed.utils import format_dashboard_link, get_ip

    server = getattr(getattr(getattr(client, "cluster", None), "scheduler", None), "http_server", None)
    host, port = getattr(server, "address", None), getattr(server, "port", None)
    if host is None or port is None:
        link = client.dashboard_link
        return [f"Dashboard: {link}"] if link else []
    if not ipaddress.ip_address(host).is_unspecified:
        return [f"Dashboard: {format_dashboard_link(f'[{host}]' if ':' in host else host, port)}"]
    return [
        f"Dashboard: {format_dashboard_link(get_ip(), port)}",  # the address other machines reach
        f"warning: the dashboard listens on every interface of this machine ({host}:{port}): whoever can "
        f"reach it can watch the run and stop its tasks; dashboard: 127.0.0.1:{port} keeps it to this machine",
    ]


class DashboardHostError(InputError):
    """The dashboard's host is not an address of this machine: found when the cluster starts, so the
    run adds its config file's name."""


def _port_free(host: str, port: int) -> bool:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:  # an unknown name (gaierror) or another machine's address: the host's fault
            if isinstance(e, socket.gaierror) or e.errno == errno.EADDRNOTAVAIL:
                raise DashboardHostError(
                    f"dashboard: {host} is not an address of this machine (or does not "
                    f"resolve); give 127.0.0.1:PORT, 0.0.0.0:PORT to open it to the "
                    f"network, or false"
                ) from None
            return False  # taken
    return True


#: Where the dashboard's server (bokeh on tornado, on asyncio) logs a viewer's connection failing.
DASHBOARD_LOGGERS = (
    "bokeh.server.views.ws",
    "bokeh.server.protocol_handler",
    "bokeh.server.connection",
    "bokeh.server.session",
    "tornado.application",
    "tornado.general",
    "asyncio",
)
#: Exceptions (names in the class hierarchy, so tornado loads only with the dashboard) that mean the
#: viewer's connection is gone.
CLOSED = frozenset({"WebSocketClosedError", "StreamClosedError", "ConnectionError"})


def _closed(exc) -> bool:
    """Whether ``exc`` or an exception it was raised from or during is a closed connection."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(c.__name__ in CLOSED for c in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class ViewerGone(logging.Filter):
    """Drops the records a dashboard viewer who disconnects abruptly (a closed tab, a killed browser,
    a dropped network) leaves: bokeh's "Failed sending message as connection was closed" and any
    record whose exception is a closed connection (tornado's "Uncaught exception" and asyncio's
    "exception was never retrieved" with a 20-line WebSocketClosedError / StreamClosedError
    traceback). The run is unaffected; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Failed sending message as connection was closed"):
            return False
        return not (record.exc_info and _closed(record.exc_info[1]))


_VIEWER_GONE = ViewerGone()


def quiet_viewer_disconnects() -> None:
    """Put :class:`ViewerGone` on the dashboard's loggers of this process (once)."""
    for name in DASHBOARD_LOGGERS:
        logger = logging.getLogger(name)
        if _VIEWER_GONE not in logger.filters:
            logger.addFilter(_VIEWER_GONE)


@contextlib.contextmanager
def taken_port_quiet():
    """Dask's multi-line "Port 8787 is already in use ... Hosting the HTTP server on port N instead"
    warning, silenced while a scheduler starts here: the port is taken between dashboard_address's
    check and the bind when another run starts at the same moment, and the link printed is the real
    one either way. The scheduler's dashboard serves from this process: the records of a viewer who
    disconnects are dropped from now on (:func:`quiet_viewer_disconnects`)."""
    import warnings

    quiet_viewer_disconnects()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Port \d+ is already in use", category=UserWarning)
        yield
