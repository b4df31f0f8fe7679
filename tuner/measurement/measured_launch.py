"""One measured launch: start a pinned argv, wait until it is ready, warm up and run the workload or the load
levels (or a caller's own requests), watch the host meanwhile, stop it.

Why one owner: every launch the tuner measures (a trial, a race's, verify's, the benches') is then checked the
same way: which other processes took CPU during it, whether its threads stayed on the CPUs its argv asked for,
where the models' pages were placed, which pages were huge, and whether the log says speculation was off. A check added here reaches them all.

A lookup that remembers requests (``knobs.registry.REMEMBERING_LOOKUP_TYPES``) is measured one pass per launch,
warmed up on text no pass measures: in one server its second pass would draft every answer from the first's
(on the scale target's prose, ngram-mod at K=8 read 74 tokens/s over two passes in one server, 54 over one).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, TypeVar

from tuner.machine.host import busy_processes, cpu_seconds_by_process, host_was_busy
from tuner.machine.placement import pinning_problem, read_numa_maps, read_smaps_rollup, read_thread_cpus
from tuner.measurement.launch import asked_cpus, compute_threads
from tuner.measurement.load import Level, run_levels
from tuner.measurement.measure import MeasurementSettings, Sample, another_pass, run_workload, warm_up
from tuner.measurement.server_process import LlamaServer, free_port
from tuner.measurement.workload import Workload

T = TypeVar("T")

# How a study measures a lookup that remembers, stored with a study whose space holds one (``StudyRecord``
# comparability): a study measured before the rule, one server per measurement, read such lookups high.
REMEMBERING_LOOKUP_RULE = "a launch per pass"


class StoppedEarly(Exception):
    """A request hook's way to end a launch before its workload did (a trial that cannot beat the incumbent);
    the launch sets ``busy`` (what other processes took meanwhile, as ``MeasuredLaunch.busy``) before it passes
    on, so a decision made on a busy host can say so."""

    busy: dict[str, float] = {}


@dataclass(frozen=True)
class ServerLaunch:
    """What is launched: a pinned ``argv``, its log file, ``timeout_s`` for each request (and for readiness
    unless ``ready_timeout_s``), and the model files whose page placement is read (``models``)."""

    argv: Sequence[str]
    log_path: Path
    timeout_s: float = 120.0
    ready_timeout_s: float | None = None
    models: Sequence[Path] = ()


@dataclass(frozen=True)
class Requests:
    """What a launch serves: the workload's passes (``passes``; else its warm-up alone), then each of
    ``levels`` users at once. ``speculative`` and ``after_request`` as ``run_workload`` takes them;
    ``remembers``: the speculation remembers requests (``TrialConfig.remembers_requests``), so each pass is a
    launch of its own."""

    workload: Workload
    settings: MeasurementSettings
    temperature: float
    passes: bool = True
    levels: tuple[int, ...] = ()
    speculative: bool = False
    after_request: Callable[[list[Sample], bool, bool], None] | None = None
    remembers: bool = False


@dataclass(frozen=True)
class MeasuredLaunch(Generic[T]):
    """What one launch measured, and what the host did meanwhile."""

    samples: list[Sample]
    levels: list[Level]
    busy: dict[str, float]  # cores other processes used during the launch (``machine.host.busy_processes``)
    pages: dict[str, dict[int, int]]  # model file -> NUMA node -> pages
    memory: dict[str, int]  # which pages were huge (THP), locked: ``machine.placement.read_smaps_rollup``
    spec_problem: str | None  # the log lines saying speculation is off
    log_tail: str
    ready_s: float  # process start until it answered /health: loading included
    measure_s: float  # the requests, the caller's own (``then``) left out
    stop_s: float
    then: T | None  # what the caller's own requests returned
    # the server's threads not held to the CPUs its argv asked for (``machine.placement.pinning_problem``)
    unpinned: str | None = None

    @property
    def host_busy(self) -> bool:
        return host_was_busy({"busy_processes": self.busy})


def measured_launch(
    launch: ServerLaunch,
    *,
    requests: Requests | None = None,
    then: Callable[[LlamaServer], T] | None = None,
    on_running: Callable[[int], None] | None = None,
) -> MeasuredLaunch[T]:
    """Launch ``launch.argv``, serve ``requests``, then ``then(server)`` for requests of the caller's own;
    ``on_running(port)`` once it is up. A failed launch raises its ``TrialFailure``; the server is stopped on
    every path. Requests that ``remember`` get a launch per pass (``_launch_per_pass``)."""
    if requests is not None and requests.passes and requests.remembers:
        return _launch_per_pass(launch, requests, then, on_running)
    return _launch_once(launch, requests, then, on_running)


def _launch_once(
    launch: ServerLaunch,
    requests: Requests | None,
    then: Callable[[LlamaServer], T] | None,
    on_running: Callable[[int], None] | None,
) -> MeasuredLaunch[T]:
    argv, log_path, timeout_s, ready_timeout_s = (
        launch.argv,
        launch.log_path,
        launch.timeout_s,
        launch.ready_timeout_s,
    )
    models = launch.models
    before, started = cpu_seconds_by_process(), time.monotonic()
    server = LlamaServer(
        list(argv),
        free_port(),
        log_path,
        ready_timeout_s=timeout_s if ready_timeout_s is None else ready_timeout_s,
        request_timeout_s=timeout_s,
    )
    with server:
        ready = time.monotonic()
        pid = server.pid
        assert pid is not None  # the server is up inside the block
        if on_running:
            on_running(server.port)
        try:
            samples, levels = _serve(server, requests) if requests else ([], [])
        except StoppedEarly as stopped:
            stopped.busy = busy_processes(
                before, cpu_seconds_by_process(), time.monotonic() - started, {os.getpid(), pid}
            )
            raise
        unpinned = pinning_problem(asked_cpus(argv), read_thread_cpus(pid), compute_threads(argv))
        measured = time.monotonic()
        extra = then(server) if then else None
        busy = busy_processes(
            before, cpu_seconds_by_process(), time.monotonic() - started, {os.getpid(), pid}
        )
        pages = read_numa_maps(pid, list(models))
        memory = read_smaps_rollup(pid)
        spec_problem, log_tail = server.speculation_log_problem(), server.log_tail()
        stopping = time.monotonic()
    return MeasuredLaunch(
        samples=samples,
        levels=levels,
        busy=busy,
        pages=pages,
        memory=memory,
        spec_problem=spec_problem,
        log_tail=log_tail,
        ready_s=ready - started,
        measure_s=measured - ready,
        stop_s=time.monotonic() - stopping,
        then=extra,
        unpinned=unpinned,
    )


def _launch_per_pass(
    launch: ServerLaunch,
    requests: Requests,
    then: Callable[[LlamaServer], T] | None,
    on_running: Callable[[int], None] | None,
) -> MeasuredLaunch[T]:
    """Each pass a launch of its own, warmed up on unseen text; passes follow ``run_workload``'s rule, the
    samples numbered by pass, ``after_request`` sees them all. The levels and ``then`` are served by the first
    launch, after its pass. One launch read busy makes the whole busy: ``busy`` keeps each name's most."""
    settings = requests.settings
    cap = max(settings.repetitions, settings.max_repetitions or settings.repetitions)
    one_pass = replace(settings, repetitions=1, max_repetitions=None)
    samples: list[Sample] = []
    launched: list[MeasuredLaunch[T]] = []
    for repetition in range(cap):
        if repetition and not another_pass(samples, repetition, cap, settings):
            break
        first = not launched
        try:
            one = _launch_once(
                replace(launch, log_path=_pass_log(launch.log_path, repetition)),
                replace(
                    requests,
                    settings=one_pass,
                    levels=requests.levels if first else (),
                    after_request=_numbered_hook(requests, samples, repetition, cap),
                ),
                then if first else None,
                on_running,
            )
        except StoppedEarly as stopped:
            stopped.busy = _most_busy([one.busy for one in launched] + [stopped.busy])
            raise
        samples = samples + _numbered(one.samples, repetition)
        launched.append(one)
    head, last = launched[0], launched[-1]
    return replace(
        head,
        samples=samples,
        busy=_most_busy([one.busy for one in launched]),
        spec_problem=next((one.spec_problem for one in launched if one.spec_problem), None),
        unpinned=next((one.unpinned for one in launched if one.unpinned), None),
        log_tail=last.log_tail,
        ready_s=sum(one.ready_s for one in launched),
        measure_s=sum(one.measure_s for one in launched),
        stop_s=sum(one.stop_s for one in launched),
    )


def _most_busy(readings: list[dict[str, float]]) -> dict[str, float]:
    """Several launches' ``busy`` as one: each name's most."""
    busy: dict[str, float] = {}
    for reading in readings:
        for name, cores in reading.items():
            busy[name] = max(busy.get(name, 0.0), cores)
    return busy


def _pass_log(log_path: Path, repetition: int) -> Path:
    """The first pass keeps the launch's log; a later one ``NAME-passN.log`` beside it."""
    return (
        log_path
        if not repetition
        else log_path.with_name(f"{log_path.stem}-pass{repetition + 1}{log_path.suffix}")
    )


def _numbered(samples: list[Sample], repetition: int) -> list[Sample]:
    return [replace(s, repetition=repetition) for s in samples]


def _numbered_hook(
    requests: Requests, earlier: list[Sample], repetition: int, cap: int
) -> Callable[[list[Sample], bool, bool], None] | None:
    """The caller's hook over every pass so far; after a pass, whether another launch follows decides ``more``."""
    hook = requests.after_request
    if hook is None:
        return None

    def after_request(so_far: list[Sample], pass_done: bool, more: bool) -> None:
        every = earlier + _numbered(so_far, repetition)
        hook(
            every,
            pass_done,
            more or (pass_done and another_pass(every, repetition + 1, cap, requests.settings)),
        )

    return after_request


def _serve(server: LlamaServer, requests: Requests) -> tuple[list[Sample], list[Level]]:
    workload, settings, temperature = requests.workload, requests.settings, requests.temperature
    samples = []
    if requests.passes:
        samples = run_workload(
            server,
            workload,
            settings,
            temperature,
            after_request=requests.after_request,
            speculative=requests.speculative,
            unseen_warmup=requests.remembers,
        )
    else:
        warm_up(server, workload, settings, temperature, requests.remembers)
    levels = run_levels(
        server, workload.prompts, requests.levels, settings.n_predict, temperature, settings.seed
    )
    return samples, levels
