"""A real Prometheus scrapes a running voiceagent, and the Metrics section of
docs/operations.md is checked against the server and against Prometheus.

A module fixture starts a server on the tiny model and Debian's `prometheus` binary
scraping it every second, then runs a short WebSocket load. The TTFA p95 Prometheus
computes from the histogram must agree with what the clients were told in `turn.done`;
every PromQL query and alert expression in the docs must be accepted by it (the TTFA and
turns-by-outcome ones must also have data after the load). The docs' metrics table must
list exactly the families a server exposes, with their types and label names (that test
needs no Prometheus). Without the binary the Prometheus tests skip; CI installs it
(deploy/setup.sh --test).
"""

from __future__ import annotations

import asyncio
import math
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import run
from prometheus_client import metrics as client_metrics

from voiceagent.bench.clients import Client, connect
from voiceagent.model.speech_model import SpeechModel
from voiceagent.ops.metrics import TTFA_BUCKETS, GpuMemory, Runtime
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port

ROOT = Path(__file__).resolve().parents[1]
OPERATIONS = ROOT / "docs" / "operations.md"

SESSIONS, TURNS = 3, 3  # the load: SESSIONS WebSocket sessions at once, TURNS turns each
TEXTS = ("Hello there.", "Two short words.", "One more small sentence.")
ROUNDING_S = 0.001  # turn.done reports ttfa_ms rounded to 0.1 ms
OPENING_S = 0.25  # generous: from a turn's opening to its text, on a busy machine
TTFA_P95 = "histogram_quantile(0.95, sum by (le) (rate(voiceagent_ttfa_seconds_bucket[1m])))"


@dataclass
class Scraped:
    server: BackgroundServer
    prometheus: str  # http://127.0.0.1:PORT
    promtool: Path
    told_ttfa_s: list[float]  # timings.ttfa_ms of every turn.done, in seconds


def wait_for(what: str, check: Callable[[], Any], timeout: float, log: Path | None = None) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except httpx.HTTPError:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            tail = "" if log is None else "\nprometheus log:\n" + log.read_text()[-3000:]
            pytest.fail(f"{what}: not reached in {timeout:.0f} s{tail}")
        time.sleep(0.25)


def query(prometheus: str, promql: str) -> dict[str, Any]:
    """The `data` of an instant query; fails unless Prometheus answers `success`."""
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=30)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (
        f"{promql}\n-> HTTP {response.status_code}: {body}"
    )
    return dict(body["data"])


def total(prometheus: str, promql: str) -> float:
    """The sum of a vector query's values (0 for an empty vector)."""
    return sum(float(r["value"][1]) for r in query(prometheus, promql)["result"])


@pytest.fixture(scope="module")
def prometheus_binary() -> Path:
    found = shutil.which("prometheus")
    if found is None:
        pytest.skip(
            "the prometheus binary is not installed (apt-get install prometheus; "
            "deploy/setup.sh --test installs it)"
        )
    return Path(found)


def start_prometheus(
    binary: Path, directory: Path, target: str
) -> tuple[subprocess.Popen[bytes], str]:
    config = directory / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: voiceagent\n"
        "    metrics_path: /metrics\n"
        "    static_configs:\n"
        f"      - targets: ['{target}']\n"
    )
    url = f"http://127.0.0.1:{free_port()}"
    log = directory / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address={url.removeprefix('http://')}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"prometheus exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        return httpx.get(f"{url}/-/ready", timeout=5).status_code == 200

    try:
        wait_for("prometheus /-/ready", ready, timeout=60, log=log)
    except BaseException:
        stop(process)
        raise
    return process, url


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


async def talk(server: BackgroundServer, turns: int) -> list[float]:
    """One WebSocket session speaking `turns` turns; the ttfa_ms each turn.done told."""
    async with connect(server.url) as ws:
        client = Client(ws)
        await client.start()
        told = []
        for i in range(turns):
            done = (await client.speak(TEXTS[i % len(TEXTS)])).event("turn.done")
            told.append(done["timings"]["ttfa_ms"] / 1000)
        return told


async def load(server: BackgroundServer) -> list[float]:
    sessions = await asyncio.gather(*(talk(server, TURNS) for _ in range(SESSIONS)))
    return [t for told in sessions for t in told]


@pytest.fixture(scope="module")
def scraped(
    prometheus_binary: Path, tiny_model: SpeechModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scraped]:
    server = BackgroundServer(tiny_model, ServerConfig(port=free_port())).start()
    try:
        directory = tmp_path_factory.mktemp("prometheus")
        target = server.http.removeprefix("http://")
        process, url = start_prometheus(prometheus_binary, directory, target)
        log = directory / "prometheus.log"
        try:
            # A labelled series only exists from its first event, and rate() counts from
            # the first sample Prometheus has of it: one turn first, seen by a scrape, so
            # that the load's turns all count in rate() below.
            told = run(talk(server, 1))
            wait_for(
                "a scrape that saw the first turn",
                lambda: total(url, "voiceagent_ttfa_seconds_count") == 1,
                timeout=60,
                log=log,
            )
            told += run(load(server))
            wait_for(
                f"a scrape after the load ({len(told)} turns)",
                lambda: total(url, "voiceagent_ttfa_seconds_count") == len(told),
                timeout=60,
                log=log,
            )
            yield Scraped(server, url, prometheus_binary.with_name("promtool"), told)
        finally:
            stop(process)
    finally:
        server.stop()


# -- Prometheus agrees with the clients ------------------------------------------------


def bucket_bounds(seconds: float) -> tuple[float, float]:
    """(lower, upper) bound of the TTFA bucket an observation of `seconds` falls in."""
    lower = 0.0
    for upper in TTFA_BUCKETS:
        if seconds <= upper:
            return lower, upper
        lower = upper
    return lower, math.inf


def test_prometheus_scrapes_the_server_and_its_ttfa_p95_matches_the_clients(
    scraped: Scraped,
) -> None:
    url = scraped.prometheus
    wait_for(
        'up{job="voiceagent"} == 1',
        lambda: total(url, 'up{job="voiceagent"}') == 1,
        timeout=30,
    )
    result = query(url, TTFA_P95)["result"]
    assert len(result) == 1, result
    p95 = float(result[0]["value"][1])
    assert math.isfinite(p95), f"p95 TTFA is {p95}"
    told = scraped.told_ttfa_s
    # (the metric counts from a turn's first text, a little after it opened)
    lower = bucket_bounds(max(0.0, min(told) - OPENING_S))[0]
    upper = bucket_bounds(max(told) + ROUNDING_S)[1]
    assert lower <= p95 <= upper, (
        f"Prometheus says p95 TTFA {p95:.3f} s; the clients were told {sorted(told)}, "
        f"so it should lie in [{lower}, {upper}]"
    )
    # and the count Prometheus has is what the clients counted, per transport
    counts = query(url, "voiceagent_ttfa_seconds_count")["result"]
    assert [(r["metric"]["transport"], float(r["value"][1])) for r in counts] == [
        ("websocket", len(told))
    ]


# -- the Metrics section of docs/operations.md -------------------------------------------


def metrics_section() -> list[str]:
    lines = OPERATIONS.read_text().splitlines()
    start = lines.index("## Metrics")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@dataclass
class Row:
    name: str
    type: str
    labels: set[str]


def metrics_table() -> dict[str, Row]:
    """The `| metric | type | labels | meaning |` table, by metric name."""
    lines = metrics_section()
    header = next(i for i, line in enumerate(lines) if line.startswith("| metric |"))
    assert cells(lines[header])[:3] == ["metric", "type", "labels"]
    rows: dict[str, Row] = {}
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        metric, kind, labels = cells(line)[:3]
        match = re.fullmatch(r"`([a-z_*]+)`", metric)
        assert match, f"metrics table: row '{metric}' is not one `name`"
        name = match.group(1)
        assert name not in rows, f"metrics table: {name} twice"
        rows[name] = Row(name, kind, set(re.findall(r"`([a-z_]+)`", labels)))
    return rows


def code_blocks(language: str) -> list[str]:
    blocks, block, inside = [], [], False
    for line in metrics_section():
        if line.startswith("```"):
            if inside:
                blocks.append("\n".join(block))
            inside, block = line == f"```{language}", []
        elif inside:
            block.append(line)
    return blocks


def documented_queries() -> list[str]:
    """Every query of the section's ```promql blocks (one per line)."""
    return [q for b in code_blocks("promql") for q in b.splitlines() if q.strip()]


def alert_rules() -> list[dict[str, Any]]:
    files = [yaml.safe_load(b) for b in code_blocks("yaml") if "groups:" in b]
    assert files, "no rule file (a ```yaml block with groups:) in the Metrics section"
    return [rule for f in files for group in f["groups"] for rule in group["rules"]]


def exposed_families(text: str) -> dict[str, str]:
    """name -> type of every family in a scrape, from its `# TYPE` lines."""
    found = re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE)
    return dict(found)


def gpu_family(monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, set[str]]:
    """What GpuMemory exports on a CUDA machine, with torch.cuda faked when there is none."""
    import torch

    if not torch.cuda.is_available():
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 1)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 2)
    [family] = list(GpuMemory().collect())
    labels = {name for s in family.samples for name in s.labels}
    return family.name, family.type, labels


def runtime_families() -> dict[str, set[str]]:
    """name -> label names of what Runtime exports, collected on an event loop's thread
    (as /metrics is) so that the asyncio task gauge is there."""

    async def collect() -> list[Any]:
        return list(Runtime().collect())

    return {f.name: {n for s in f.samples for n in s.labels} for f in asyncio.run(collect())}


def test_runtime_gauges_count_threads_and_tasks_and_skip_tasks_off_the_loop() -> None:
    async def on_loop() -> dict[str, float]:
        extra = [asyncio.create_task(asyncio.sleep(1)) for _ in range(3)]
        values = {f.name: f.samples[0].value for f in Runtime().collect()}
        for task in extra:
            task.cancel()
        return values

    values = asyncio.run(on_loop())
    assert values["voiceagent_asyncio_tasks"] == 4  # the three, and on_loop itself
    assert values["voiceagent_threads"] >= 1
    off_loop = [f.name for f in Runtime().collect()]  # no running loop here: no task gauge
    assert off_loop == ["voiceagent_threads"]


def test_the_metrics_table_lists_exactly_what_the_server_exposes(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Needs no Prometheus: the table against a server's own scrape and its code."""
    table = metrics_table()
    text = httpx.get(f"{server.http}/metrics", timeout=30).text
    exposed = exposed_families(text)
    gpu_name, gpu_type, gpu_labels = gpu_family(monkeypatch)
    exposed[gpu_name] = gpu_type  # (only present with CUDA: the table lists it anyway)

    # prometheus-client's `_created` companions of counters and histograms go unlisted
    # (the docs say so)
    companions = {
        n.removesuffix("_total") + "_created"
        for n, r in table.items()
        if r.type in ("counter", "histogram")
    }
    created = {n for n in exposed if n.endswith("_created")}
    assert created <= companions, f"_created of no listed metric: {created - companions}"
    process = {n: t for n, t in exposed.items() if n.startswith("process_")}
    own = {n: t for n, t in exposed.items() if n not in created and n not in process}

    documented = {n: r.type for n, r in table.items() if n != "process_*"}
    assert set(documented) == set(own), (
        f"documented but not exposed: {sorted(set(documented) - set(own))}; "
        f"exposed but not documented: {sorted(set(own) - set(documented))}"
    )
    wrong = {n: (documented[n], own[n]) for n in own if documented[n] != own[n]}
    assert not wrong, f"documented type != exposed type: {wrong}"
    assert "process_*" in table and process, "process_* (ProcessCollector) is missing"
    assert set(table["process_*"].type.split(", ")) == set(process.values())

    # labels: each metric's label names, as the code declares them
    declared: dict[str, set[str]] = {gpu_name: gpu_labels, **runtime_families()}
    for metric in vars(server.engine.metrics).values():
        if isinstance(metric, client_metrics.MetricWrapperBase):
            suffix = {"counter": "_total", "info": "_info"}.get(metric._type, "")
            declared[metric._name + suffix] = set(metric._labelnames)
    info = re.search(r"^voiceagent_info\{(.*)\} 1\.0$", text, flags=re.MULTILINE)
    assert info, "no voiceagent_info sample in the scrape"
    declared["voiceagent_info"] = set(re.findall(r"(\w+)=", info.group(1)))
    assert set(declared) == set(own)
    wrong_labels = {
        n: (sorted(table[n].labels), sorted(declared[n]))
        for n in declared
        if table[n].labels != declared[n]
    }
    assert not wrong_labels, f"documented labels != the code's: {wrong_labels}"


def test_every_documented_query_runs_on_prometheus(scraped: Scraped) -> None:
    queries = documented_queries()
    assert len(queries) >= 15, f"only {len(queries)} queries found in the Metrics section"
    for promql in queries:
        result = query(scraped.prometheus, promql)["result"]
        if "voiceagent_ttfa_seconds_bucket" in promql or "voiceagent_turns_total" in promql:
            assert result, f"no data after the load for: {promql}"
            values = [float(r["value"][1]) for r in result]
            assert all(math.isfinite(v) for v in values), f"{promql} -> {values}"


def test_the_documented_alert_rules_load_and_their_expressions_run(
    scraped: Scraped, tmp_path: Path
) -> None:
    rules = alert_rules()
    assert rules
    for rule in rules:
        assert {"alert", "expr", "for"} <= set(rule), rule
        query(scraped.prometheus, rule["expr"])
    if not scraped.promtool.exists():
        pytest.skip(f"promtool is not next to {scraped.promtool.parent / 'prometheus'}")
    rule_file = tmp_path / "rules.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "docs", "rules": rules}]}))
    check = subprocess.run(
        [str(scraped.promtool), "check", "rules", str(rule_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
