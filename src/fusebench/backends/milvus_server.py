"""A Milvus server as ``search=milvus``'s engine (``search.uri=http://HOST:PORT``): what differs from Milvus Lite
embedded in the run, in one place (``backends/kinds/milvus.py`` runs the same steps through :class:`Remote`).

* **Settings** (``MilvusParams``: ``search.uri``, ``token_env``, ``connect_timeout_s``, ``request_timeout_s``,
  ``retries``) are checked here: the URI's scheme (http, https, tcp) and host, never credentials in it (the token
  is read from the environment variable ``token_env`` names, when the run connects: it is never in the config,
  the record, a log line, W&B or an error message).
* **Collections**: one per direction, named ``fusebench_<RUN>_<DIRECTION>`` (``RUN``: 12 hex digits of the hash
  of the run's direction folder, ``RUN_DIR/engine_db/DIRECTION``, so a rerun into the same run dir uses the same
  names) and created with the property ``fusebench_run`` = ``RUN`` (the marker). Under that name, a collection
  with the marker is this run dir's own (a killed run's leftovers, or kept by ``search.keep_db``): dropped and made
  again, never read; one without it is someone else's: refused before any work, never read, changed or dropped.
  Only the collections this run created are ever dropped.
* **Faults**: every request carries ``request_timeout_s`` (pymilvus retries an unavailable server within it), a
  transient failure (server unavailable, deadline passed, rate limited) is tried again up to ``retries`` times
  after 1, 2, 4 ... s, and what is left is one :class:`~fusebench.FusebenchError` naming the URI (never a token)
  and the stage (connect, ingest, index, search, drop).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

from fusebench import FusebenchError
from fusebench.backends.engine_dirs import ENGINE_DIR

SCHEMES = ("http", "https", "tcp")  # what pymilvus connects to over the network (client/connection_manager.py)
MARK = "fusebench_run"  # the collection property that says fusebench made it, and for which run dir
MARK_DIR = "fusebench_run_dir"  # the run dir it was made for (for a person looking at the server)
PREFIX = "fusebench_"
# Milvus' limit on vector fields in one collection (proxy.maxVectorFieldNum, 4 by default in Milvus 2.4-2.6;
# a server may raise it): one per model here
MAX_VECTOR_FIELDS = 4
INSERT_BYTES = 16 * 2**20  # vector bytes per insert request (Milvus' gRPC cap is 256 MB a message; its default
#   proxy.maxInsertSize is 64 MB)
# what the server answers when it is away or busy for a moment: tried again (grpc.StatusCode names; pymilvus'
#   Status.CONNECT_FAILED = 2; ErrorCode.RATE_LIMIT = 8)
TRANSIENT_GRPC = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")
TRANSIENT_CODES = (2, 8)
BACKOFF_S = 1.0  # the first wait before a retry; doubled each time, up to MAX_BACKOFF_S
MAX_BACKOFF_S = 30.0
MAX_RETRIES = 10  # search.retries at most: a server away for longer is a fault to report, not to wait out
log = logging.getLogger(__name__)


def check_uri(uri) -> str:
    """``search.uri`` as given, when it is http(s)://HOST[:PORT] or tcp://HOST[:PORT] without credentials."""
    if not isinstance(uri, str) or not uri.strip():
        raise FusebenchError(f"search.uri={uri!r} is not valid; valid: http://HOST:PORT (a Milvus server), or null "
                             "(Milvus Lite embedded in the run).")
    parsed = urlparse(uri)
    if parsed.scheme.lower() not in SCHEMES or not parsed.hostname:
        raise FusebenchError(f"search.uri={masked(uri)} is not a Milvus server address; valid: "
                             f"{' | '.join(s + '://HOST:PORT' for s in SCHEMES)} (a Milvus Lite .db path is what "
                             "search.uri=null runs, inside the run dir).")
    if parsed.username or parsed.password:
        raise FusebenchError(f"search.uri={shown(uri)} holds credentials, which would then be in the run's config "
                             "and record: give the address alone and put the token in an environment variable "
                             "named by search.token_env.")
    if parsed.query or parsed.fragment or parsed.params:
        raise FusebenchError(f"search.uri={masked(uri)} has a query or fragment (?...#...), which could carry a "
                             "credential into the run's config and record; valid: http://HOST:PORT alone (the token "
                             "in an environment variable named by search.token_env).")
    try:
        parsed.port  # noqa: B018 (a port that is not a number raises)
    except ValueError:
        raise FusebenchError(f"search.uri={masked(uri)} has a port that is not a number; valid: http://HOST:PORT.") \
            from None
    return uri


def masked(text: str) -> str:
    """A value given as ``search.uri`` as a message may show it, whatever its shape: what comes before an '@' in the
    address (user:password, with or without a scheme) and after a '?' or '#' is left out."""
    text = re.sub(r"[?#].*$", "?***", text)
    head, sep, rest = text.partition("//")
    head, rest = (head + sep, rest) if sep else ("", text)
    host, slash, path = rest.partition("/")
    if "@" in host:
        host = "***@" + host.rpartition("@")[2]
    return head + host + slash + path


def shown(uri: str) -> str:
    """The URI as every message and the record say it: without credentials."""
    parsed = urlparse(uri)
    if not (parsed.username or parsed.password):
        return uri
    host = parsed.hostname or ""
    return parsed._replace(netloc=host + (f":{parsed.port}" if parsed.port else "")).geturl()


def check_token_env(name) -> str | None:
    """``search.token_env``: null, or the name of an environment variable (never the token itself)."""
    if name is None:
        return None
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise FusebenchError("search.token_env is not an environment variable's name; valid: a name such as "
                             "MILVUS_TOKEN (the variable holds the token; the config never does), or null.")
    return name


def token(search) -> str:
    """The token the environment variable ``search.token_env`` holds ('' without one); a variable named but not set
    is refused, naming the variable (never a value)."""
    if search.token_env is None:
        return ""
    value = os.environ.get(search.token_env)
    if not value:
        raise FusebenchError(f"search.token_env={search.token_env} names an environment variable that is not set "
                             f"(or empty) here: export {search.token_env}=... (the Milvus token) before the run, or "
                             "set search.token_env=null for a server without authentication.")
    return value


def run_key(folder: str | Path) -> str:
    """16 hex digits naming a run dir's direction folder (RUN_DIR/engine_db/DIRECTION) on this host: the same for a
    rerun into it, another for the same path on another machine (whose run lock is not this one's)."""
    where = f"{socket.gethostname()}\0{Path(folder).resolve()}"
    return hashlib.sha256(where.encode("utf-8")).hexdigest()[:16]


def collection_name(folder: str | Path, direction: str) -> str:
    """The collection of ``direction`` for the run dir whose direction folder is ``folder``."""
    return f"{PREFIX}{run_key(folder)}_{direction}"


def transient(err: BaseException) -> bool:
    """Whether a failed request is worth sending again: the server away or busy for a moment."""
    code = getattr(err, "code", None)
    code = code() if callable(code) else code
    name = getattr(code, "name", None)
    if name is not None:
        return name in TRANSIENT_GRPC
    return code in TRANSIENT_CODES


def _reason(err: BaseException, secret: str) -> str:
    """The server's or the client's own words, on one line, with any trace of the token taken out."""
    text = " ".join(str(getattr(err, "message", None) or err).split())
    return text.replace(secret, "***") if secret else text


@contextmanager
def _quiet_client():
    """pymilvus logs every failed request with its traceback (decorators.py error_handler): the run says it once,
    as one line, instead."""
    logger = logging.getLogger("pymilvus")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


class Remote:
    """One connection to the server of ``search.uri`` for one direction's collection: every request through
    :meth:`call` (timeout, bounded retries, one clear error)."""

    def __init__(self, pymilvus, search, folder: str | Path, direction: str):
        self.pymilvus, self.search = pymilvus, search
        self.uri = shown(search.uri)
        self.name = collection_name(folder, direction)
        self.key, self.folder = run_key(folder), str(Path(folder).resolve().parent.parent)
        self.secret = token(search)
        self.client = None
        self.created = False

    def fail(self, stage: str, err: BaseException | str) -> FusebenchError:
        why = err if isinstance(err, str) else _reason(err, self.secret)
        return FusebenchError(f"search.uri={self.uri}: the Milvus server failed at {stage} ({why}); nothing of "
                              f"anyone else's was touched (search.connect_timeout_s={self.search.connect_timeout_s:g}, "
                              f"search.request_timeout_s={self.search.request_timeout_s:g}, "
                              f"search.retries={self.search.retries}).")

    def call(self, stage: str, method: str, *args, retry: str | None = None, keep: bool = False, **kwargs):
        """``client.method(*args, timeout=request_timeout_s, **kwargs)``; a transient failure is sent again up to
        ``search.retries`` times (as ``retry`` when given: an insert is sent again as an upsert, so that one the
        server applied but whose answer was lost is not held twice). What is left is :meth:`fail`'s one line, or,
        with ``keep``, a non-transient MilvusException as it is (for a step that reads its code)."""
        wait = BACKOFF_S
        for attempt in range(self.search.retries + 1):
            name = method if attempt == 0 or retry is None else retry
            try:
                with _quiet_client():
                    return getattr(self.client, name)(*args, timeout=self.search.request_timeout_s, **kwargs)
            except Exception as err:  # noqa: BLE001 (pymilvus raises MilvusException, grpc.RpcError and others)
                if keep and not transient(err) and isinstance(err, self.pymilvus.MilvusException):
                    raise
                if not transient(err) or attempt == self.search.retries:
                    raise self.fail(stage, err) from None
                log.warning("search.uri=%s: %s failed at %s (%s); trying again in %g s (%d of %d)", self.uri, name,
                            stage, _reason(err, self.secret), wait, attempt + 1, self.search.retries)
                time.sleep(wait)
                wait = min(2 * wait, MAX_BACKOFF_S)
        raise AssertionError("unreachable")

    def connect(self) -> str:
        """Open the client (retried as a request is) and return the server's version."""
        wait = BACKOFF_S
        for attempt in range(self.search.retries + 1):
            try:
                with _quiet_client():
                    self.client = self.pymilvus.MilvusClient(uri=self.search.uri, token=self.secret,
                                                             timeout=self.search.connect_timeout_s)
                break
            except Exception as err:  # noqa: BLE001 (as in call)
                if not transient(err) or attempt == self.search.retries:
                    raise self.fail("connect", err) from None
                time.sleep(wait)
                wait = min(2 * wait, MAX_BACKOFF_S)
        return str(self.call("connect", "get_server_version"))

    def claim(self) -> None:
        """Make the collection's name free for this run: a leftover of this run dir's (the marker, this run's key)
        is dropped; a collection without the marker is refused, untouched."""
        if not self.call("connect", "has_collection", self.name):
            return
        mine = mark_of(self.call("connect", "describe_collection", self.name)) == self.key
        if not mine:
            raise foreign(self.uri, self.name)
        log.warning("search.uri=%s: collection %s is an earlier run's in this run dir (a run that did not finish, or "
                    "kept by search.keep_db): dropped, made again; never read", self.uri, self.name)
        self.call("drop", "drop_collection", self.name)

    def create(self, schema) -> None:
        """The run's collection, with the marker that makes it known as this run dir's."""
        self.call("ingest", "create_collection", self.name, schema=schema, consistency_level="Strong",
                  properties={MARK: self.key, MARK_DIR: self.folder})  # Strong: a search sees every row inserted
        self.created = True

    def check_rows(self, expected: int) -> None:
        """Once the collection is loaded: the server holds exactly the items sent (none lost, none twice), counted by
        its ``count(*)`` at Strong consistency (``get_collection_stats``' row_count also counts the rows an upsert
        replaced until compaction, so an insert sent again as an upsert would read as held twice)."""
        rows = self.call("ingest", "query", self.name, filter="", output_fields=["count(*)"],
                         consistency_level="Strong")
        held = int(rows[0]["count(*)"]) if rows else -1
        if held != expected:
            raise self.fail("ingest", f"the collection holds {held:,} rows, {expected:,} were sent")

    def drop(self) -> None:
        """Drop the collection this run created (never one it did not), in one request of at most
        ``connect_timeout_s`` (after a fault the server is likely gone: not waited out a second time); a failure is a
        warning naming it, and the next run into this run dir drops it."""
        if self.client is None or not self.created:
            return
        try:
            with _quiet_client():
                self.client.drop_collection(self.name, timeout=self.search.connect_timeout_s)
        except Exception as err:  # noqa: BLE001 (as in call)
            log.warning("%s; the collection %s stays on the server: the next run into this run dir drops it",
                        self.fail("drop", err), self.name)

    def close(self) -> None:
        if self.client is not None:
            try:
                with _quiet_client():
                    self.client.close()
            except Exception:  # noqa: BLE001 (closing a channel to a server that is gone)
                pass


def mark_of(described) -> str | None:
    """The run key a described collection's marker holds, or None without one."""
    properties = (described or {}).get("properties") or {}
    value = properties.get(MARK)
    return str(value) if value is not None else None


def foreign(uri: str, name: str) -> FusebenchError:
    return FusebenchError(f"search.uri={uri}: a collection named {name} is on the server and fusebench did not make "
                          f"it for this run dir (no '{MARK}' property of this run): it is never read, changed or "
                          "dropped; drop or rename it yourself, or choose another hydra.run.dir=... (the name "
                          "follows from the run dir).")


def preflight(pymilvus, search, out_dir: str | Path, directions) -> None:
    """Before any work: the server answers, and no collection under this run's names is someone else's."""
    for direction in directions:
        remote = Remote(pymilvus, search, Path(out_dir) / ENGINE_DIR / direction, direction)
        try:
            remote.connect()
            if remote.call("connect", "has_collection", remote.name) and \
                    mark_of(remote.call("connect", "describe_collection", remote.name)) != remote.key:
                raise foreign(remote.uri, remote.name)
        finally:
            remote.close()


def insert_rows(dims: list[int]) -> int:
    """Rows per insert request: about INSERT_BYTES of float32 vectors, at least 1."""
    return max(1, INSERT_BYTES // (4 * sum(dims)))


class Guarded:
    """The client ``kinds/milvus.py``'s steps talk to, for a server: each request it sends (``client.insert(
    COLLECTION, rows)``, ``.search``, ...) goes through :meth:`Remote.call` to this run's collection, under the
    stage it belongs to; building a schema or index parameters stays local."""

    STAGES = {"insert": "ingest", "flush": "ingest", "create_index": "index", "describe_index": "index",
              "load_collection": "index", "search": "search", "hybrid_search": "search"}
    KEEP = ("create_index",)  # its MilvusException reaches the step as it is (kinds/milvus.py _build reads its code)

    def __init__(self, remote: Remote):
        self.remote = remote

    def prepare_index_params(self):
        return self.remote.client.prepare_index_params()

    def __getattr__(self, method: str):
        stage = self.STAGES[method]

        def send(_collection, *args, **kwargs):
            if method in self.KEEP:
                kwargs["keep"] = True
            return self.remote.call(stage, method, self.remote.name, *args,
                                    retry="upsert" if method == "insert" else None, **kwargs)
        return send
