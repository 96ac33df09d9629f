"""``search=milvus search.uri=http://HOST:PORT`` against a real Milvus server process (Milvus Lite's own gRPC server,
``python -m milvus_lite server``, on a free port, started by a fixture): its lists equal the embedded path's on the
same rows, bit for bit; it creates only its own marked collections and drops them (kept with search.keep_db); a
collection of someone else's under its name is refused before any work and left untouched; a run killed
mid-ingest leaves collections the rerun drops; the server gone (port closed, killed mid-ingest or mid-search) or
refusing the token is one line naming the URI and the stage, within bounded time; the token never reaches the run
dir, its log or the record.

Milvus Lite's server checks no token (adapter/grpc/servicer.py has no authentication), so a refused token is tested
against pymilvus' own answer to one (a MilvusException, code 1800 or gRPC UNAUTHENTICATED), raised by a stand-in
client: docs/search.md says so."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pymilvus = pytest.importorskip("pymilvus")
pytest.importorskip("milvus_lite")

from helpers import engine_case as case  # noqa: E402

from fusebench import FusebenchError  # noqa: E402
from fusebench.backends import milvus_server as server  # noqa: E402
from fusebench.backends.kinds import milvus as engine  # noqa: E402
from fusebench.config.search import SearchConfig  # noqa: E402

PRESETS = ("milvus_rrf", "milvus_weighted", "milvus_weighted_ip")
SECRET = "fusebench-test-token-5f1c9a"  # what the token variable holds in the tests that set one


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A ``milvus-lite server`` process on a free port (the console script is milvus_lite.cmdline:main)."""

    def __init__(self, data: Path):
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(data),
                                      "--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the milvus-lite server did not start") from None
                time.sleep(0.1)
        self.client = pymilvus.MilvusClient(uri=self.uri, timeout=10)
        self.client.get_server_version()  # it answers

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def collections(self) -> list[str]:
        return sorted(self.client.list_collections())


@pytest.fixture
def milvus(tmp_path_factory):
    running = Server(tmp_path_factory.mktemp("milvus-server"))
    yield running
    try:
        running.client.close()
    finally:
        running.kill()


def _config(uri: str | None, **search) -> SearchConfig:
    return SearchConfig(backend="milvus", **{"latency_queries": 4, "batch_size": 64, **search,
                                             **({"uri": uri, "request_timeout_s": 5.0, "connect_timeout_s": 3.0,
                                                 "retries": 1} if uri else {})})


def _request(workdir: Path, uri: str | None, preset: str = "milvus_rrf", n_items: int = 400, n_queries: int = 200,
             direction: str = "t2i", **search):
    workdir.mkdir(parents=True, exist_ok=True)
    items, queries = case.corpus(n_items=n_items, n_queries=n_queries, dims=(24, 16))
    weights = {"a": 1.0, "b": 0.6} if preset == "milvus_weighted" else None
    return case.request(items, queries, case.preset(preset, top_k=20), workdir, _config(uri, **search),
                        weights=weights, direction=direction)


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.slow  # starts a Milvus Lite server process and Milvus Lite in this one
@pytest.mark.parametrize("preset", PRESETS)
def test_server_lists_equal_the_embedded_lists(milvus, tmp_path, preset):
    """The same 400 items and 200 queries through the server and through embedded Milvus Lite: every single and
    fused id and score identical (200 of 200 queries); the collection is dropped at the end and nothing is written
    under the run's folder; the version names the server that answered."""
    embedded = engine.run(_request(tmp_path / "embedded", None, preset))
    req = _request(tmp_path / "engine_db" / "t2i", milvus.uri, preset)
    served = engine.run(req)
    np.testing.assert_array_equal(served.fused_ids, embedded.fused_ids)
    np.testing.assert_array_equal(served.fused_scores, embedded.fused_scores)
    assert (served.fused_ids[:, 0] >= 0).sum() == 200
    for m in req.models:
        for got, want in zip(served.singles[m], embedded.singles[m]):
            np.testing.assert_array_equal(got, want)
    assert milvus.collections() == []  # dropped
    assert not any((tmp_path / "engine_db" / "t2i").iterdir())
    assert served.version == f"pymilvus {pymilvus.__version__}, Milvus server milvus_lite-3.2.2 at {milvus.uri}" \
        or served.version.startswith(f"pymilvus {pymilvus.__version__}, Milvus server ")
    assert any("client-to-server over the network" in n for n in served.notes)
    assert served.disk_bytes == 0 and served.latency_ms.shape == (4,) and (served.latency_ms > 0).all()


@pytest.mark.slow  # starts a Milvus Lite server process
def test_ingest_in_batches_checks_the_rows_held(milvus, tmp_path, monkeypatch):
    """Batches of about INSERT_BYTES (here 7 rows of 24 + 16 floats), every item held once: a server that holds
    another count than was sent is refused at ingest."""
    monkeypatch.setattr(server, "INSERT_BYTES", 7 * 4 * 40)
    sent, extra = [], []
    original = server.Remote.call

    def counting(self, stage, method, *args, **kwargs):
        if method == "insert":
            sent.append(len(args[1]))
        answer = original(self, stage, method, *args, **kwargs)
        if method == "query" and extra:  # a server that holds one row more than was sent
            answer = [{"count(*)": int(answer[0]["count(*)"]) + 1}]
        return answer

    monkeypatch.setattr(server.Remote, "call", counting)
    req = _request(tmp_path / "engine_db" / "t2i", milvus.uri, n_items=50, n_queries=5)
    engine.run(req)
    assert sent == [7] * 7 + [1]
    extra.append(1)
    with pytest.raises(FusebenchError, match=r"failed at ingest \(the collection holds 51 rows, 50 were sent"):
        engine.run(req)
    assert milvus.collections() == []


@pytest.mark.slow  # starts a Milvus Lite server process
def test_an_insert_whose_answer_was_lost_is_sent_again_as_an_upsert(milvus, tmp_path, monkeypatch):
    """The server applied the batch but its answer never came (a transient failure): the batch goes again as an
    upsert, and the rows counted after the load are the items sent, each once."""
    monkeypatch.setattr(server, "BACKOFF_S", 0.01)
    calls = []
    insert, upsert = pymilvus.MilvusClient.insert, pymilvus.MilvusClient.upsert

    def answer_lost(self, *args, **kwargs):
        calls.append("insert")
        answer = insert(self, *args, **kwargs)
        if calls.count("insert") == 2:  # the second batch: applied, its answer lost
            raise pymilvus.MilvusException(code=2, message="connection reset after the batch was applied")
        return answer

    def counted_upsert(self, *args, **kwargs):
        calls.append("upsert")
        return upsert(self, *args, **kwargs)

    monkeypatch.setattr(server, "INSERT_BYTES", 7 * 4 * 40)
    monkeypatch.setattr(pymilvus.MilvusClient, "insert", answer_lost)
    monkeypatch.setattr(pymilvus.MilvusClient, "upsert", counted_upsert)
    out = engine.run(_request(tmp_path / "engine_db" / "t2i", milvus.uri, n_items=50, n_queries=5))
    assert calls[:3] == ["insert", "insert", "upsert"] and calls.count("upsert") == 1  # the lost one, sent again
    assert out.singles and milvus.collections() == []


@pytest.mark.slow  # starts a Milvus Lite server process
def test_keep_db_keeps_and_names_the_collection_and_the_rerun_drops_it(milvus, tmp_path):
    folder = tmp_path / "run" / "engine_db" / "t2i"
    out = engine.run(_request(folder, milvus.uri, n_queries=10, keep_db=True))
    name = server.collection_name(folder, "t2i")
    assert milvus.collections() == [name] and name.startswith("fusebench_") and name.endswith("_t2i")
    described = milvus.client.describe_collection(name)
    assert described["properties"][server.MARK] == server.run_key(folder)
    assert milvus.client.get_collection_stats(name)["row_count"] == 400
    assert any(f"collection {name} kept on {milvus.uri}" in n for n in out.notes)
    again = engine.run(_request(folder, milvus.uri, n_queries=10))  # the same run dir: its own leftover, dropped
    np.testing.assert_array_equal(again.fused_ids, out.fused_ids)
    assert milvus.collections() == []


KILLED_RUN = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from helpers import engine_case as case
from fusebench.backends import milvus_server as server
from fusebench.backends.kinds import milvus as engine
from fusebench.config.search import SearchConfig

server.INSERT_BYTES = 20 * 4 * 40
original = server.Remote.call
sent = []
def call(self, stage, method, *args, **kwargs):
    if method == "insert":
        sent.append(1)
        if len(sent) == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # the run killed mid-ingest: no finally runs
    return original(self, stage, method, *args, **kwargs)
server.Remote.call = call
items, queries = case.corpus(n_items=400, n_queries=5, dims=(24, 16))
config = SearchConfig(backend="milvus", uri=sys.argv[1], latency_queries=0)
engine.run(case.request(items, queries, case.preset("milvus_rrf", top_k=20), Path(sys.argv[2]), config))
"""


@pytest.mark.slow  # starts a Milvus Lite server process and a run that is killed
def test_a_run_killed_mid_ingest_leaves_marked_collections_the_rerun_drops(milvus, tmp_path):
    folder = tmp_path / "run" / "engine_db" / "t2i"
    folder.mkdir(parents=True)
    tests = str(Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", KILLED_RUN.format(tests=tests), milvus.uri, str(folder)],
                          capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    name = server.collection_name(folder, "t2i")
    assert milvus.collections() == [name]  # left half-filled, marked as this run dir's
    assert milvus.client.describe_collection(name)["properties"][server.MARK] == server.run_key(folder)
    out = engine.run(_request(folder, milvus.uri, n_queries=10))
    assert (out.fused_ids >= 0).all() and milvus.collections() == []


def _foreign(milvus, name: str, properties: dict | None = None) -> None:
    schema = milvus.client.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("pk", pymilvus.DataType.INT64, is_primary=True)
    schema.add_field("emb", pymilvus.DataType.FLOAT_VECTOR, dim=4)
    milvus.client.create_collection(name, schema=schema, properties=properties or {"owner": "someone"})
    milvus.client.insert(name, [{"pk": i, "emb": [1.0, 0.0, 0.0, float(i)]} for i in range(3)])
    milvus.client.flush(name)


@pytest.mark.slow  # starts a Milvus Lite server process
@pytest.mark.parametrize("mark", [None, "0123456789ab"])  # no marker; another run dir's marker
def test_a_collection_of_someone_else_under_the_name_is_refused_before_any_work(milvus, tmp_path, monkeypatch, mark):
    folder = tmp_path / "run" / "engine_db" / "t2i"
    name = server.collection_name(folder, "t2i")
    _foreign(milvus, name, {server.MARK: mark} if mark else None)
    before = milvus.client.describe_collection(name)
    sent = []
    monkeypatch.setattr(server.Remote, "create", lambda self, schema: sent.append(schema))
    with pytest.raises(FusebenchError) as err:
        engine.run(_request(folder, milvus.uri, n_queries=5))
    message = _one_line(err)
    assert name in message and milvus.uri in message and "did not make it" in message
    with pytest.raises(FusebenchError, match=name):  # the pipeline's check, before any embedding
        engine.preflight(_config(milvus.uri), tmp_path / "run")
    assert not sent  # nothing created
    assert milvus.collections() == [name]  # untouched: its rows and properties as they were
    assert milvus.client.describe_collection(name)["properties"] == before["properties"]
    assert milvus.client.get_collection_stats(name)["row_count"] == 3


@pytest.mark.slow  # > 0.1 s: connection attempts
def test_port_closed_is_one_line_at_connect_quickly(tmp_path):
    uri = f"http://127.0.0.1:{_free_port()}"
    began = time.monotonic()
    with pytest.raises(FusebenchError) as err:
        engine.run(_request(tmp_path / "engine_db" / "t2i", uri, n_queries=5))
    message = _one_line(err)
    assert f"search.uri={uri}: the Milvus server failed at connect" in message
    assert time.monotonic() - began < 3.0 + 2 * 3.0 + 1.0 + 5  # connect_timeout_s x (1 + retries) + backoff
    assert not any((tmp_path / "engine_db" / "t2i").iterdir())


def _kill_after(milvus, monkeypatch, method: str, calls: int) -> None:
    """Kill the server process once ``method`` was sent ``calls`` times (the next request meets no server)."""
    original = server.Remote.call
    seen = []

    def call(self, stage, name, *args, **kwargs):
        if name == method:
            seen.append(1)
            if len(seen) == calls + 1:
                milvus.kill()
        return original(self, stage, name, *args, **kwargs)

    monkeypatch.setattr(server.Remote, "call", call)


@pytest.mark.slow  # starts and kills a Milvus Lite server process
@pytest.mark.parametrize("method, stage", [("insert", "ingest"), ("search", "search")])
def test_server_killed_midway_is_one_line_naming_uri_and_stage_in_bounded_time(milvus, tmp_path, monkeypatch,
                                                                                 method, stage):
    monkeypatch.setattr(server, "INSERT_BYTES", 50 * 4 * 40)
    _kill_after(milvus, monkeypatch, method, 2)
    began = time.monotonic()
    with pytest.raises(FusebenchError) as err:
        engine.run(_request(tmp_path / "engine_db" / "t2i", milvus.uri, n_queries=200, batch_size=16))
    took = time.monotonic() - began
    message = _one_line(err)
    assert f"search.uri={milvus.uri}: the Milvus server failed at {stage}" in message
    assert took < 2 * 5.0 + 1.0 + 10  # request_timeout_s x (1 + retries) + backoff, with room for the work
    assert not any((tmp_path / "engine_db" / "t2i").iterdir())


class _Refusing:
    """A client whose server refuses the token, as pymilvus reports it (Milvus: code 1800, 'auth check failure')."""

    made = 0

    def __init__(self, **kwargs):
        type(self).made += 1
        raise pymilvus.MilvusException(code=1800, message=f"auth check failure, please check username/password "
                                                          f"(token {kwargs.get('token')})")


@pytest.mark.slow  # > 0.1 s: imports pymilvus
def test_a_refused_token_is_one_line_at_connect_without_the_token(tmp_path, monkeypatch):
    """Milvus Lite's server takes any token; a Milvus that refuses it answers code 1800: not retried, one line at
    connect, the token's text taken out of the server's words."""
    monkeypatch.setenv("FUSEBENCH_TEST_TOKEN", SECRET)
    monkeypatch.setattr(pymilvus, "MilvusClient", _Refusing)
    with pytest.raises(FusebenchError) as err:
        engine.run(_request(tmp_path, "http://127.0.0.1:19530", n_queries=5, token_env="FUSEBENCH_TEST_TOKEN"))
    message = _one_line(err)
    assert "failed at connect (auth check failure" in message and SECRET not in message and "***" in message
    assert _Refusing.made == 1  # refused: not a transient failure


def test_transient_failures_are_the_server_away_or_busy():
    class Rpc(Exception):
        def __init__(self, name):
            self.name = name

        def code(self):
            return type("Code", (), {"name": self.name})()

    assert server.transient(Rpc("UNAVAILABLE")) and server.transient(Rpc("DEADLINE_EXCEEDED"))
    assert not server.transient(Rpc("UNAUTHENTICATED")) and not server.transient(Rpc("INVALID_ARGUMENT"))
    assert server.transient(pymilvus.MilvusException(code=2, message="Fail connecting to server"))
    assert not server.transient(pymilvus.MilvusException(code=1800, message="auth check failure"))
    assert not server.transient(ValueError("bad"))


def test_collection_names_are_valid_milvus_names_and_follow_the_run_dir(tmp_path):
    a = server.collection_name(tmp_path / "run" / "engine_db" / "t2i", "t2i")
    assert a == server.collection_name(tmp_path / "run" / "x" / ".." / "engine_db" / "t2i", "t2i")  # resolved
    assert a != server.collection_name(tmp_path / "other" / "engine_db" / "t2i", "t2i")
    assert a.replace("_", "").isalnum() and not a[0].isdigit() and len(a) <= 255 and a.endswith("_t2i")
    with pytest.MonkeyPatch.context() as patch:  # the same path on another machine: another run's collections
        patch.setattr(server.socket, "gethostname", lambda: "another-host")
        assert server.collection_name(tmp_path / "run" / "engine_db" / "t2i", "t2i") != a
    assert server.insert_rows([1152, 1152]) * 4 * 2304 <= server.INSERT_BYTES and server.insert_rows([10**9]) == 1


def _job(compose_cfg, out: Path, *extra: str) -> dict:
    from fusebench.app.pipeline import run

    cfg = compose_cfg(["dataset=sim", "dataset.n_images=120", "dataset.n_captions=240", "search=milvus",
                       "fusion=milvus_rrf", "fusion.top_k=20", "eval.lists.depth=20", "eval.save_topk=20",
                       "search.latency_queries=2", "logger=none", "plots=false", "eval.bootstrap.draws=50",
                       f"paths.output_dir={out}", f"embed.cache.dir={out.parent / 'cache'}", *extra])
    run(cfg, str(out / "run"))
    return json.loads((out / "run" / "metrics.json").read_text())


@pytest.mark.slow  # two whole jobs and a server process
def test_a_job_against_the_server_equals_the_embedded_job_and_keeps_no_token(compose_cfg, milvus, tmp_path,
                                                                            monkeypatch, caplog):
    """The engine in the loop: the same sim job embedded and against the server, every fused rank and saved list
    identical (the 240 captions t2i, 120 images i2t); the record names the server and labels its latency; the token
    the environment holds is in no file of the run dir and no log line."""
    monkeypatch.setenv("FUSEBENCH_TEST_TOKEN", SECRET)
    embedded = _job(compose_cfg, tmp_path / "embedded")
    served = _job(compose_cfg, tmp_path / "served", f"search.uri={milvus.uri}", "search.token_env=FUSEBENCH_TEST_TOKEN")
    for direction in ("t2i", "i2t"):
        assert served["retrievers"]["fused"][direction] == embedded["retrievers"]["fused"][direction]
        assert served["search"]["parity"][direction] == embedded["search"]["parity"][direction]
    runs = {k: tmp_path / k / "run" for k in ("embedded", "served")}
    lists = {k: sorted(p.relative_to(r).as_posix() for folder in ("ranks", "topk") for p in (r / folder).iterdir())
             for k, r in runs.items()}
    assert lists["served"] == lists["embedded"] and len(lists["served"]) == 17  # every retriever's ranks and lists
    for rel in lists["served"]:
        got, want = (np.load(runs[k] / rel) for k in ("served", "embedded"))
        if rel.endswith(".npz"):
            assert sorted(got.files) == sorted(want.files), rel
            for key in got.files:
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"{rel} {key}")
        else:
            np.testing.assert_array_equal(got, want, err_msg=rel)
    search = served["search"]
    assert search["label"] == "milvus flat server" and milvus.uri in search["version"]
    assert any("client-to-server over the network" in n for n in search["notes"])
    assert milvus.collections() == []
    for path in (tmp_path / "served").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text


CLI = [sys.executable, "-m", "fusebench.app.cli", "dataset=sim", "dataset.n_images=60", "dataset.n_captions=120",
       "search=milvus", "logger=none", "plots=false", "eval.bootstrap.draws=20"]


@pytest.mark.slow  # a CLI process
def test_cli_exit_2_before_any_work_when_the_port_is_closed(tmp_path):
    uri = f"http://127.0.0.1:{_free_port()}"
    env = {**os.environ, "FUSEBENCH_TEST_TOKEN": SECRET}
    done = subprocess.run([*CLI, f"search.uri={uri}", "search.token_env=FUSEBENCH_TEST_TOKEN", "search.retries=0",
                           f"hydra.run.dir={tmp_path / 'run'}", f"embed.cache.dir={tmp_path / 'cache'}"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"search.uri={uri}: the Milvus server failed at connect" in done.stderr
    assert "Traceback" not in done.stderr and SECRET not in done.stderr + done.stdout
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]  # refused before any embedding
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


@pytest.mark.slow  # a CLI process and a server process
def test_cli_exit_2_before_any_work_for_a_foreign_collection(milvus, tmp_path):
    run_dir = tmp_path / "run"
    name = server.collection_name(run_dir / "engine_db" / "t2i", "t2i")
    _foreign(milvus, name)
    done = subprocess.run([*CLI, f"search.uri={milvus.uri}", f"hydra.run.dir={run_dir}",
                           f"embed.cache.dir={tmp_path / 'cache'}"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert name in done.stderr and "Traceback" not in done.stderr
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert milvus.collections() == [name] and milvus.client.get_collection_stats(name)["row_count"] == 3


def test_a_server_config_has_the_server_capacity_not_the_embedded_one():
    """Past Milvus Lite's measured 2,000,000 items the embedded run is refused; the server holds what it holds.
    Milvus' own limit of 4 vector fields a collection (one per model) is refused when the config is checked."""
    from fusebench.backends import base

    milvus_backend = base.get("milvus")
    past = milvus_backend.capacity.items + 1
    with pytest.raises(FusebenchError, match="search.uri=http://HOST:PORT"):
        base.check_capacity(milvus_backend, 2, False, past, search=_config(None))
    base.check_capacity(milvus_backend, 2, False, past, search=_config("http://127.0.0.1:19530"))
    engine.check_server(_config("http://127.0.0.1:19530"), 4)
    with pytest.raises(FusebenchError, match=r"5 models .* past Milvus' default limit of 4 \(proxy.maxVectorFieldNum\)"):
        engine.check_server(_config("http://127.0.0.1:19530"), 5)


def test_uris_are_shown_without_credentials_and_a_token_variable_is_read_only_when_set(monkeypatch):
    assert server.shown("http://root:Milvus@h:19530/db") == "http://h:19530/db"
    assert server.shown("https://h") == "https://h"
    monkeypatch.delenv("FUSEBENCH_TEST_TOKEN", raising=False)
    config = _config("http://h:1", token_env="FUSEBENCH_TEST_TOKEN")
    with pytest.raises(FusebenchError, match="search.token_env=FUSEBENCH_TEST_TOKEN names an environment variable"):
        server.token(config)
    monkeypatch.setenv("FUSEBENCH_TEST_TOKEN", SECRET)
    assert server.token(config) == SECRET and server.token(_config("http://h:1")) == ""
    assert SECRET not in repr(config)
