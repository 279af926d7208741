"""A dashboard viewer who disconnects abruptly: the records its server logs are dropped (a 20-line
bokeh/tornado traceback printed among a run's lines), every other record of those loggers kept."""

import asyncio
import logging

import pytest
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError

from metricpipe.cluster import taken_port_quiet


def _exc_info(exc):
    try:
        raise exc
    except BaseException as e:  # noqa: BLE001 - the record's exc_info, as a logger gets it
        return type(e), e, e.__traceback__


def _stream_closed_by_reset():
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as e:
            raise StreamClosedError(real_error=e) from e
    except StreamClosedError as e:
        return type(e), e, e.__traceback__


@pytest.fixture
def quiet():
    with taken_port_quiet():  # where a scheduler (and its dashboard) starts in this process
        pass


GONE = [
    ("bokeh.server.views.ws", logging.WARNING, "Failed sending message as connection was closed", None),
    ("tornado.application", logging.ERROR, "Uncaught exception GET /status/ws (127.0.0.1)", WebSocketClosedError()),
    ("asyncio", logging.ERROR, "Task exception was never retrieved", "reset"),
    ("bokeh.server.views.ws", logging.ERROR, "Handler or its work threw an exception", BrokenPipeError(32, "pipe")),
]
KEPT = [
    ("tornado.application", logging.ERROR, "Uncaught exception GET /status", ValueError("a real bug")),
    ("bokeh.server.views.ws", logging.ERROR, "Bokeh Server protocol error: bad, closing connection", None),
    ("asyncio", logging.WARNING, "Executing <Task> took 1.2 seconds", None),
]


def _emit(name, level, msg, exc):
    info = _stream_closed_by_reset() if exc == "reset" else (_exc_info(exc) if exc is not None else None)
    logging.getLogger(name).log(level, msg, exc_info=info)


@pytest.mark.parametrize(("name", "level", "msg", "exc"), GONE)
def test_a_viewer_s_disconnect_leaves_nothing(quiet, caplog, name, level, msg, exc):
    with caplog.at_level(logging.DEBUG):
        _emit(name, level, msg, exc)
    assert caplog.records == []


@pytest.mark.parametrize(("name", "level", "msg", "exc"), KEPT)
def test_other_records_of_the_dashboard_s_loggers_pass(quiet, caplog, name, level, msg, exc):
    with caplog.at_level(logging.DEBUG):
        _emit(name, level, msg, exc)
    assert [r.getMessage() for r in caplog.records] == [msg]


def test_asyncio_s_own_report_of_a_lost_task_is_dropped(quiet, caplog):
    """The record asyncio's default exception handler makes (exc_info from the context's exception)."""
    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.DEBUG):
            loop.default_exception_handler(
                {"message": "Task exception was never retrieved", "exception": WebSocketClosedError()}
            )
            loop.default_exception_handler(
                {"message": "Task exception was never retrieved", "exception": KeyError("x")}
            )
    finally:
        loop.close()
    assert [r.exc_info[0] for r in caplog.records] == [KeyError]
