"""Several users at once (issue 24): the load generator's arithmetic on crafted requests, the study file's
concurrency, load objectives and constraints, the serving knobs in the space and the argv, and the load
generator at 2 users against the real llama-server on the synthetic target.

Only counts, orderings and relations are checked against the real server, never a speed.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from benchmarks.concurrency import LevelComparison, parse_batched_bench
from benchmarks.replay import replay_record
from tuner.errors import UserError
from tuner.knobs.config import Choices, RawSpace, TrialConfig
from tuner.measurement.launch import LaunchContext, build_server_command, model_flags
from tuner.measurement.load import Level, LoadRequest, percentile, plan, run_level, split_metric_name
from tuner.measurement.workload import Prompt, load_workload
from tuner.paths import models_dir
from tuner.progress import Progress
from tuner.search.space import SpaceHost, SpaceTarget, resolve_space, suggest
from tuner.storage.records import TrialRecord, changes
from tuner.studyfile.spec import load_spec
from tuner.studyfile.validate import Fields
from tuner.studyfile.written_space import parse_space

SYNTH = models_dir() / "synthetic"


def request(
    client: int, wall: float, predicted: float, n: int = 10, prompt_ms: float = 5.0, start: float = 0.0
):
    return LoadRequest(2, client, f"p{client}", n, predicted, 8, prompt_ms, wall, start)


# ------------------------------------------------------------------ arithmetic on crafted data


def test_a_level_pools_tokens_over_its_wall_time_and_reads_latency_from_the_server():
    level = Level(
        2,
        (
            request(0, wall=120.0, predicted=100.0),
            request(1, wall=150.0, predicted=100.0, n=20),
            request(0, wall=101.0, predicted=100.0, prompt_ms=30.0),
        ),
        wall_s=0.5,
    )
    assert level.tokens == 40 and level.aggregate_tokens_per_second == pytest.approx(80.0)
    ttft = [r.ttft_ms for r in level.requests]
    assert ttft == [20.0, 50.0, 30.0]  # wall less generation, never below the server's prompt time
    assert [r.tpot_ms for r in level.requests] == [10.0, 5.0, 10.0]
    summary = level.summary()
    assert summary["p50_ttft_ms"] == 30.0 and summary["p95_ttft_ms"] == pytest.approx(48.0)
    assert (
        summary["requests"] == 3 and len(summary["samples"]) == 3 and summary["samples"][1]["ttft_ms"] == 50.0
    )


def test_percentile_interpolates_between_ranks():
    assert percentile([], 95) == 0.0
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([5.0, 1.0], 95) == pytest.approx(4.8)


def test_plan_gives_every_client_as_many_requests_and_covers_the_suite():
    prompts = tuple(Prompt(f"p{i}", "s", f"text {i}") for i in range(5))
    work = plan(prompts, 2)
    assert [len(w) for w in work] == [3, 3]
    assert {p.id for w in work for p in w} == {f"p{i}" for i in range(5)}
    assert [len(w) for w in plan(prompts, 4, rounds=3)] == [3, 3, 3, 3]
    assert work[0][0].id == "p0" and work[1][0].id == "p1"  # dealt round-robin


def test_load_metric_names_carry_their_level():
    assert split_metric_name("p95_ttft_ms_c4") == ("p95_ttft_ms", 4)
    assert split_metric_name("aggregate_tokens_per_second") == ("aggregate_tokens_per_second", None)
    assert split_metric_name("tokens_per_second") is None and split_metric_name("p95_ttft_s") is None


def test_a_trial_record_answers_load_objectives_by_name_and_round_trips():
    level = Level(2, (request(0, 120.0, 100.0),), 0.25).summary()
    record = TrialRecord(3, "COMPLETE", "search", TrialConfig(parallel=2), load=(level,))
    assert record.objective("aggregate_tokens_per_second_c2") == pytest.approx(40.0)
    assert record.load_figures()["p95_ttft_ms_c2"] == pytest.approx(20.0)
    with pytest.raises(KeyError):
        record.objective("p95_ttft_ms_c4")
    back = TrialRecord.from_json(record.to_json(), 3, "COMPLETE")
    assert back.load == record.load and back.config.parallel == 2
    assert (
        TrialRecord.from_json({"config": {}, "role": "search"}, 1, "FAIL").load == ()
    )  # a record from before


def test_parse_batched_bench_counts_generated_tokens_over_the_whole_time():
    jsonl = (
        'main: ignored line\n{"pp": 40, "tg": 128, "pl": 1, "t": 0.5, "speed": 336.0}\n'
        '{"pp": 40, "tg": 128, "pl": 2, "t": 0.8, "speed": 420.0}\n'
    )
    assert parse_batched_bench(jsonl) == {1: pytest.approx(256.0), 2: pytest.approx(320.0)}
    # the median of paired per-round ratios: one round hit on one side (the third) does not decide
    near = LevelComparison(2, (95.0, 99.0, 5.0), (100.0, 100.0, 100.0))
    far = LevelComparison(4, (80.0, 85.0), (100.0, 100.0))
    assert near.ratio == pytest.approx(0.95) and near.within and not far.within


# ------------------------------------------------------------------ the study file


def write(tmp_path: Path, **fields) -> Path:
    study = {
        "name": "c",
        "target": str(SYNTH / "target.gguf"),
        "search_space": {"overrides": {"spec_type": "none", "threads": 1}},
        "workload": {"suites": ["code"], "n_predict": 32, "concurrency": [1, 2]},
        "measurement": {"warmup": 1, "repetitions": 1, "ctx_size": 512, "trial_timeout_s": 120},
        "storage": f"sqlite:///{tmp_path / 'studies.db'}",
        "sampler": {"name": "tpe", "seed": 1, "prune": False},
        "budget": {"trials": 1},
    }
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(study.get(key), dict):
            study[key] = {**study[key], **value}
        else:
            study[key] = value
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def refusal(tmp_path: Path, **fields) -> str:
    with pytest.raises(UserError) as err:
        load_spec(write(tmp_path, **fields))
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "study.yaml"))
    return message


@pytest.mark.parametrize(
    "fields, expected",
    [
        (
            {"workload": {"concurrency": [0, 2]}},
            "workload.concurrency[0]: expected a number of users >= 1, got 0",
        ),
        (
            {"workload": {"concurrency": [2, 2]}},
            "workload.concurrency: expected a non-empty list of distinct user counts",
        ),
        (
            {"workload": {"concurrency": [1, 32]}},
            "workload.concurrency: 32 users split measurement.ctx_size 512 into 16 "
            "tokens per slot, too few for a prompt and n_predict 32; raise",
        ),
        (
            {"constraints": {"p95_ttft_s": 2}},
            "constraints.p95_ttft_s: latency constraints are in milliseconds: "
            "write p95_ttft_ms (2 s is 2000)",
        ),
        (
            {"constraints": {"p95_ttft_ms": 0.5}},
            "constraints.p95_ttft_ms: 0.5 ms cannot be a latency bound here",
        ),
        (
            {"constraints": {"p95_ttft_ms": 5e6}},
            "constraints.p95_ttft_ms: 5e+06 ms cannot be a latency bound here",
        ),
        (
            {"constraints": {"p95_ttft_ms": "2s"}},
            "constraints.p95_ttft_ms: expected a number, got '2s'; latencies are in milliseconds",
        ),
        (
            {"constraints": {"p95_ttft_ms_c4": 2000}},
            "constraints.p95_ttft_ms_c4: workload.concurrency has no level of 4 users (1, 2)",
        ),
        ({"constraints": {"p99_latency": 5}}, "constraints.p99_latency: unknown constraint"),
        ({"objectives": [{"metric": "p95_tpot_s"}]}, "objectives[0].metric: unknown value 'p95_tpot_s'"),
    ],
)
def test_bad_concurrency_and_latency_bounds_are_one_line_errors(tmp_path, synthetic_models, fields, expected):
    assert expected in refusal(tmp_path, **fields)


def test_load_objectives_and_bounds_name_their_level(tmp_path, synthetic_models):
    spec = load_spec(
        write(
            tmp_path,
            objectives=[
                {"metric": "aggregate_tokens_per_second"},
                {"metric": "p95_ttft_ms_c1"},
                {"metric": "quality"},
            ],
            constraints={"p95_ttft_ms": 2000, "aggregate_tokens_per_second_c1": 10},
        )
    )
    assert [(o.metric, o.direction) for o in spec.objectives] == [
        ("aggregate_tokens_per_second_c2", "maximize"),
        ("p95_ttft_ms_c1", "minimize"),
        ("quality", "maximize"),
    ]
    bounds = {c.name: c for c in spec.constraints}
    assert set(bounds) == {"p95_ttft_ms_c2", "aggregate_tokens_per_second_c1"}
    assert bounds["p95_ttft_ms_c2"].violation(3000) == pytest.approx(0.5)  # 50% over: infeasible
    assert bounds["aggregate_tokens_per_second_c1"].violation(20) == pytest.approx(-1.0)  # twice the floor
    assert spec.load_levels == (1, 2)


def test_a_study_of_one_user_drives_no_load_and_stores_what_it_always_stored(tmp_path, synthetic_models):
    spec = load_spec(write(tmp_path, workload={"concurrency": [1]}))
    assert spec.load_levels == () and "concurrency" not in spec.measurement.comparability()
    old = replay_record("s", {}, ("tokens_per_second",), workload={"digest": "abc"})
    new = replay_record("s", {}, ("tokens_per_second",), workload={"digest": "abc", "concurrency": [1, 2]})
    assert old.comparability()["workload.concurrency"] == [1]
    assert any(line.startswith("workload.concurrency differs") for line in changes(old, new))


# ------------------------------------------------------------------ space and argv


def resolve(raw: RawSpace, concurrency: tuple[int, ...]):
    return resolve_space(
        raw,
        fields=Fields(Path("s.yaml"), {}),
        target=SpaceTarget(),
        host=SpaceHost(physical_cores=2, logical_cpus=2, numa_policies=("none",), numa_nodes=(0,)),
        concurrency=concurrency,
    )


def test_serving_knobs_apply_only_with_several_users():
    raw = parse_space(
        Fields(
            Path("s.yaml"),
            {
                "threads": 1,
                "poll": [0, 50],
                "parallel": [1, 2],
                "concurrent": {
                    "ubatch": [64, 512],
                    "batch": 128,
                    "flash_attn": ["on", False],
                    "cache_type_v": ["q8_0"],
                },
            },
        )
    )
    alone = resolve(raw, (1,))
    assert set(alone.domains) >= {"poll"} and not {"parallel", "ubatch", "flash_attn"} & set(alone.domains)
    assert any(note.startswith("parallel: dropped") for note in alone.notes)
    several = resolve(raw, (1, 4))
    assert several.domains["flash_attn"] == Choices(("on", "off")) and several.domains["parallel"] == Choices(
        (1, 2)
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    configs = [suggest(study.ask(), several) for _ in range(30)]
    assert all(c.ubatch <= c.batch == 128 for c in configs)  # the micro batch never exceeds the batch
    assert all((c.cache_type_v is None) == (c.flash_attn == "off") for c in configs)  # a quantized V needs FA
    assert {c.flash_attn for c in configs} == {"on", "off"}


@pytest.mark.parametrize(
    "bad, expected",
    [
        ({"flash_attn": "maybe"}, "unknown flash attention mode"),
        ({"cache_type_k": "q3_k"}, "unknown KV cache type"),
        ({"concurrent": {"parallel": 0}}, "concurrent.parallel: must be at least 1"),
        ({"poll": 101}, "a polling level is 0..100"),
    ],
)
def test_bad_serving_domains_are_refused(bad, expected):
    with pytest.raises(UserError, match=expected):
        parse_space(Fields(Path("s.yaml"), bad))


def launch_context(tmp_path: Path, slots: int) -> LaunchContext:
    from tuner.machine.topology import read_topology

    return LaunchContext(
        server_binary=Path("/bin/llama-server"),
        target=tmp_path / "t.gguf",
        drafts={},
        expert_override_key=None,
        topology=read_topology(),
        numactl=None,
        ctx_size=1024,
        slots=slots,
    )


def test_argv_carries_slots_and_serving_flags_and_nothing_new_by_default(tmp_path):
    plain = build_server_command(TrialConfig(threads=1), launch_context(tmp_path, 1)).argv
    assert plain[plain.index("--parallel") + 1] == "1"
    assert not {"--flash-attn", "--cache-type-k", "--batch-size", "--ubatch-size", "--poll"} & set(plain)
    assert build_server_command(TrialConfig(threads=1), launch_context(tmp_path, 4)).argv.count("4") >= 1
    config = TrialConfig(
        threads=1,
        parallel=2,
        batch=256,
        ubatch=64,
        flash_attn="on",
        cache_type_k="q8_0",
        cache_type_v="q8_0",
        poll=0,
    )
    argv = build_server_command(config, launch_context(tmp_path, 4)).argv
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--parallel"] == "2" and pairs["--batch-size"] == "256" and pairs["--ubatch-size"] == "64"
    assert pairs["--flash-attn"] == "on" and pairs["--cache-type-k"] == pairs["--cache-type-v"] == "q8_0"
    assert pairs["--poll"] == "0"
    # the KV cache type changes the logits: the text scorers (llama-perplexity) get it too
    assert "--cache-type-k" in model_flags(config, launch_context(tmp_path, 4))
    assert "--batch-size" not in model_flags(config, launch_context(tmp_path, 4))


# ------------------------------------------------------------------ the real server


def test_two_users_are_served_at_once_on_two_slots(tmp_path, synthetic_models):
    from tuner.machine.llama_build import binary
    from tuner.measurement.server_process import LlamaServer, free_port

    prompts = load_workload(["code"], Path(".")).prompts[:4]
    argv = [
        str(binary("llama-server")),
        "--model",
        str(synthetic_models.path("target")),
        "--ctx-size",
        "1024",
        "--parallel",
        "2",
        "--no-webui",
        "--threads",
        "1",
    ]
    with LlamaServer(argv, free_port(), tmp_path / "server.log") as server:
        level = run_level(server, prompts, 2, 48, 0.0, 42)
    assert "n_slots = 2" in (tmp_path / "server.log").read_text()
    assert len(level.requests) == 4 and sorted(r.client for r in level.requests) == [0, 0, 1, 1]
    assert sorted(r.prompt_id for r in level.requests) == sorted(p.id for p in prompts)
    assert all(r.predicted_n == 48 for r in level.requests)  # ignore_eos: every request runs to n_predict
    assert level.tokens == 4 * 48
    for r in level.requests:
        assert 0 < r.prompt_ms <= r.ttft_ms < r.wall_ms and r.tpot_ms > 0
        assert r.start_ms + r.wall_ms <= 1000 * level.wall_s + 1  # every request inside the level's window
    first = {c: min((r for r in level.requests if r.client == c), key=lambda r: r.start_ms) for c in (0, 1)}
    # both clients' first requests were in flight together: each left before the other's answer came back
    assert first[1].start_ms < first[0].start_ms + first[0].wall_ms
    assert first[0].start_ms < first[1].start_ms + first[1].wall_ms
    summary = level.summary()
    assert (
        summary["p50_ttft_ms"] <= summary["p95_ttft_ms"] and summary["p50_tpot_ms"] <= summary["p95_tpot_ms"]
    )


def test_check_refuses_prompts_that_do_not_fit_a_slot(tmp_path, synthetic_models, capsys):
    from tuner.cli import main

    path = write(tmp_path, workload={"concurrency": [1, 8]})  # 512 tokens over 8 slots: 64 each
    assert main(["run", str(path), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{path}: workload.concurrency: prompt '" in err
    assert "(measurement.ctx_size 512 split over 8 slots)" in err and "or lower the level" in err
    assert not (tmp_path / "studies.db").exists()  # nothing written


def test_a_study_of_two_levels_stores_each_level_its_objectives_and_bounds(tmp_path, synthetic_models):
    from tuner.run.study_loop import run_study
    from tuner.storage import store

    spec = load_spec(
        write(
            tmp_path,
            objectives=[{"metric": "tokens_per_second"}, {"metric": "aggregate_tokens_per_second"}],
            constraints={"p95_ttft_ms": 60000, "aggregate_tokens_per_second_c1": 1e9},
        )
    )
    study = run_study(spec, progress=Progress.quiet())
    record = store.read_study_record(study)
    assert record.objectives == ("tokens_per_second", "aggregate_tokens_per_second_c2")
    assert record.workload["concurrency"] == [1, 2]
    assert record.workload["constraints"] == {"p95_ttft_ms_c2": 60000, "aggregate_tokens_per_second_c1": 1e9}
    trial = study.trials[0]
    baseline = store.read_trial(trial)
    pairs = dict(zip(baseline.argv, baseline.argv[1:]))
    assert pairs["--parallel"] == "2"  # slots for the highest level
    assert [level["users"] for level in baseline.load] == [1, 2]
    assert all(
        level["requests"] >= level["users"] and level["tokens"] == 32 * level["requests"]
        for level in baseline.load
    )
    assert trial.values[1] == baseline.load[1]["aggregate_tokens_per_second"] > 0
    # a minute for the first token is met; a billion tokens/s is not: infeasible by that bound alone
    assert set(baseline.constraints) == {"quality_floor", "p95_ttft_ms_c2", "aggregate_tokens_per_second_c1"}
    assert baseline.constraints["p95_ttft_ms_c2"] < 0 < baseline.constraints["aggregate_tokens_per_second_c1"]
    assert baseline.constraints["quality_floor"] <= 0  # the baseline is its own quality reference
    assert (
        not baseline.feasible
        and baseline.constraint == baseline.constraints["aggregate_tokens_per_second_c1"]
    )
    assert trial.system_attrs["constraints:aggregate_tokens_per_second_c1"] > 0


LOSING_BATCHED_BENCH = """#!{python}
import json, sys
from pathlib import Path
args = sys.argv[1:]
levels = [int(x) for x in args[args.index("-npl") + 1].split(",")]
launches = Path(sys.argv[0]).with_suffix(".launches")
with launches.open("a") as seen:
    seen.write(",".join(map(str, levels)) + "\\n")
# the last level is the pad, slower than the rest: a rate taken from its row would show
rows = [json.dumps({{"pp": 10, "tg": 16, "pl": pl, "t": 0.25 * pl * (1 + 9 * (i == len(levels) - 1))}})
        for i, pl in enumerate(levels)]
if len(launches.read_text().splitlines()) <= {losing}:  # the logger lost the last rows; one is cut short
    rows = rows[:{keep}] + [rows[{keep}][:20]]
print("\\n".join(rows))
"""


@pytest.mark.parametrize(
    "losing, keep, relaunched", [(1, 1, ["1,2,4,1", "2,4,2"]), (3, 0, ["1,2,4,1", "1,2,4,1", "1,2,4,1"])]
)
def test_batched_bench_rows_lost_at_exit_are_measured_again_and_never_invented(
    tmp_path, synthetic_models, monkeypatch, losing, keep, relaunched
):
    """A stand-in batched-bench that exits 0 with its last rows lost and one cut short, as llama.cpp's logger
    does on a busy host: each launch ends with a pad level whose row is not used, the levels without a row are
    launched again, and where every launch loses them the bench stops in one line instead of comparing fewer."""
    import sys

    import benchmarks.concurrency as concurrency
    from tuner.prepare import prepare

    fake = tmp_path / "llama-batched-bench"
    fake.write_text(LOSING_BATCHED_BENCH.format(python=sys.executable, losing=losing, keep=keep))
    fake.chmod(0o755)
    monkeypatch.setattr(concurrency, "batched_bench_binary", lambda bin_dir: fake)
    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    ctx = prepare(load_spec(write(tmp_path)))
    if losing < concurrency.LOST_ROW_LAUNCHES:
        rates = concurrency.batched_bench(ctx, 10, 16, (1, 2, 4), 2048)
        assert rates == {pl: pytest.approx(16 / 0.25) for pl in (1, 2, 4)}
    else:
        with pytest.raises(UserError, match=r"rows for levels \[\] of \[1, 2, 4\] in 3 launches"):
            concurrency.batched_bench(ctx, 10, 16, (1, 2, 4), 2048)
    assert fake.with_suffix(".launches").read_text().split() == relaunched


def test_the_bench_compares_the_load_with_batched_bench_level_by_level(
    tmp_path, synthetic_models, monkeypatch
):
    from benchmarks.concurrency import markdown, measure_concurrency, to_dict
    from tuner.prepare import prepare

    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    found = measure_concurrency(
        prepare(load_spec(write(tmp_path))), levels=(1, 2), rounds=2, tg=16, per_client=1
    )
    assert [c.users for c in found] == [1, 2]
    assert all(len(c.load) == len(c.bench) == 2 and min(c.load + c.bench) > 0 for c in found)
    assert [row["users"] for row in to_dict(found)["levels"]] == [1, 2]
    assert markdown(found).count("\n| ") == 2  # one row per level
