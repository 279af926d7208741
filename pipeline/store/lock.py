"""One writer at a time: a local store's ``flock`` on ``STORE/.lock``; on an object store (no flock) an
object created only if absent (a conditional PUT) and refreshed by its holder (:class:`ObjectLock`)."""

import json
import os
import socket
import threading
import time
import uuid

from metricpipe.store.keys import json_number
from metricpipe.tasks.errors import InputError

LOCK_TRIES = 20  # a local store's lock is tried for about a second before a second writer is refused


LOCK_LEASE = 120.0  # seconds: a lock on an object store not refreshed for this long belongs to a run that is gone
LOCK_REFRESH = 20.0  # seconds between the holder's refreshes (several may fail within one lease)


class ObjectLock:
    """The one-writer lock of a store on object storage (S3 and compatible servers).

    ``STORE/.lock`` is an object written only if absent (``If-None-Match: *``), holding the holder's
    host, pid, command and token; a thread rewrites it every LOCK_REFRESH seconds, each time only if
    it is still the object this holder last wrote (``If-Match`` its ETag), and the holder deletes it
    on exit. A run killed before that leaves it behind; the next writer takes it over (again
    ``If-Match``, so of two writers that both find it stale one wins) when its holder is gone: on
    the same host, its process no longer runs; elsewhere, it was not refreshed for LOCK_LEASE
    seconds (hosts' clocks must agree to well within that), or its record holds no time of refresh
    or one more than LOCK_LEASE ahead (a damaged record no holder wrote). Otherwise the second writer gets a
    one-line error naming the holder. A holder whose refresh finds the lock taken (it was paused
    past its lease) writes no further marker, manifest or report (:meth:`Store.write_text`).

    Other fsspec backends have no conditional overwrite: there the same steps compare the holder's
    token just before writing, which leaves a narrow race between two writers starting together.
    """

    def __init__(self, store, what: str):
        self.fs, self.url, self.path = store.fs, store.url, f"{store.root}/.lock"
        self.conditional = "s3" in _protocols(store.fs)
        pid = os.getpid()
        self.me = {
            "host": socket.gethostname(),
            "pid": pid,
            "pid_started": _started(pid),
            "what": what,
            "since": time.time(),
            "token": uuid.uuid4().hex,
        }
        self.etag = None
        self.lost = None  # why this holder no longer holds the lock, once that is found
        self.took_over = None  # (record, why) of the stale lock this holder replaced
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        for _ in range(5):
            self.etag = self._write()
            if self.etag is not None:
                break
            holder, etag = self.read()
            if holder is None:  # released between our attempt and the read: try again
                continue
            why = _gone(holder)
            if why is None:
                refreshed = json_number(holder.get("refreshed"))
                ago = f", lock refreshed {time.time() - refreshed:.0f} s ago" if refreshed is not None else ""
                raise InputError(
                    f"{self.url}: the store is in use by {describe_holder(holder)}{ago} (STORE/.lock); wait "
                    f"for it to finish, or if that run is gone 'metricpipe unlock {self.url}' (a lock "
                    f"not refreshed for {LOCK_LEASE:.0f} s is taken over)"
                )
            self.etag = self._write(expect=(etag, holder.get("token")))
            if self.etag is not None:
                self.took_over = (holder, why)
                break
        else:
            raise InputError(
                f"{self.url}: the store's lock (STORE/.lock) changed hands 5 times while this run tried "
                f"to take it; another run is starting, wait for it to finish"
            )
        self._thread = threading.Thread(target=self._refresh, name="metricpipe-store-lock", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        if self.lost:
            return
        try:
            holder, _ = self.read()
            if holder is not None and holder.get("token") == self.me["token"]:
                self.fs.rm_file(self.path)
        except OSError:  # unreachable store: the lock lapses after LOCK_LEASE, so the next run can start
            pass

    def read(self) -> tuple[dict | None, str | None]:
        """(the lock's record, its ETag); (None, None) when there is no lock. The ETag is read first, so
        a conditional write with it fails if the record read is not the one it names."""
        try:
            etag = self.fs.info(self.path).get("ETag")
            raw = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None, None
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        return (record if isinstance(record, dict) else {}), etag

    def _write(self, expect: tuple | None = None) -> str | None:
        """Write this holder's record: create the lock (``expect`` None) or replace the one whose
        (ETag, token) is ``expect``. Returns the new ETag ("" where the backend has none), or None
        when the lock is not what was expected (another run's)."""
        body = json.dumps({**self.me, "refreshed": time.time()}).encode()
        try:
            if expect is None:
                out = self.fs.pipe_file(self.path, body, mode="create")
            elif self.conditional:
                out = self.fs.pipe_file(self.path, body, IfMatch=expect[0])
            else:
                holder, _ = self.read()
                if holder is None or holder.get("token") != expect[1]:
                    return None
                out = self.fs.pipe_file(self.path, body)
        except OSError as e:
            if _precondition_failed(e):
                return None
            raise
        etag = out.get("ETag") if isinstance(out, dict) else None
        if etag is None and self.conditional:
            etag = self.fs.info(self.path).get("ETag")
        return etag or ""

    def _refresh(self) -> None:
        while not self._stop.wait(LOCK_REFRESH):
            try:
                etag = self._write(expect=(self.etag, self.me["token"]))
                if etag is None:
                    holder, etag = self.read()
                    if holder is None or holder.get("token") != self.me["token"]:
                        self.lost = f"taken over by {describe_holder(holder)}" if holder else "removed by someone else"
                        return
                    # else: our own last refresh landed but its reply was lost; go on from what it wrote
            except Exception:  # a failed refresh (network) is retried; the lease allows several
                continue
            self.etag = etag


def _protocols(fs) -> tuple:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _precondition_failed(e: OSError) -> bool:
    """Whether a write was refused because its condition (If-None-Match / If-Match) did not hold."""
    if isinstance(e, FileExistsError):
        return True
    response = getattr(e.__cause__, "response", None) or {}
    return response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict")


def describe_holder(record: dict) -> str:
    return f"pid {record.get('pid')} on {record.get('host')} ({record.get('what')})"


def _started(pid: int) -> float | None:
    """The start time of process ``pid`` (it tells a reused pid from the holder), None if none runs."""
    import psutil

    try:
        p = psutil.Process(int(pid))
        return None if p.status() == psutil.STATUS_ZOMBIE else p.create_time()
    except (psutil.NoSuchProcess, ValueError, TypeError):
        return None
    except psutil.AccessDenied:
        return -1.0


def alive_here(record: dict) -> bool:
    """Whether the lock's holder is a process still running on this host."""
    if record.get("host") != socket.gethostname():
        return False
    started = _started(record.get("pid"))
    return started is not None and (started == -1.0 or abs(started - (json_number(record.get("pid_started")) or 0)) < 1)


def _gone(record: dict) -> str | None:
    """Why the lock ``record`` belongs to a run that is gone, or None while it may be running."""
    if record.get("host") == socket.gethostname():
        return None if alive_here(record) else f"pid {record.get('pid')} no longer runs on this host"
    refreshed = json_number(record.get("refreshed"))
    if refreshed is None:  # a holder writes its clock's time: this record is damaged, so nobody refreshes it
        return f"its record's refresh time {record.get('refreshed')!r} is not a time"
    age = time.time() - refreshed
    if age < -LOCK_LEASE:  # hosts' clocks agree to well within a lease: no holder wrote this
        return f"its record's refresh time is {-age:.0f} s in the future"
    return f"not refreshed for {age:.0f} s" if age > LOCK_LEASE else None
