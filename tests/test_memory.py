"""Memory knobs (issue 32): mmap and mlock (the pinned build's --load-mode) and cache_reuse in the space and
the argv; each trial's THP mode and huge pages from its server's smaps_rollup; doctor's advice from them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import optuna
import pytest
import yaml
from fake_llama_server import write_study

from tuner.errors import UserError
from tuner.machine.host import read_thp_mode
from tuner.machine.placement import parse_smaps_rollup
from tuner.measurement.launch import build_server_command
from tuner.output.doctor import thp_measured
from tuner.paths import REPO_ROOT, models_dir
from tuner.prepare import prepare
from tuner.progress import Progress
from tuner.run.study_loop import run_study
from tuner.search.space import baseline_config, suggest
from tuner.storage import store
from tuner.studyfile.spec import load_spec

DEFAULT_SPACE = REPO_ROOT / "search_spaces" / "default.yaml"


def options(command) -> dict:
    return {flag: value for flag, value in command.options}


def spaced(tmp_path: Path, **overrides) -> Path:
    """A stand-in study on the default space file, one thread, no speculation, ``overrides`` on top."""
    return write_study(
        tmp_path,
        f"sqlite:///{tmp_path / 'studies.db'}",
        search_space={
            "file": str(DEFAULT_SPACE),
            "overrides": {"spec_type": ["none"], "threads": 1, **overrides},
        },
    )


def test_the_default_space_keeps_llama_cpps_loading_and_the_stored_space(tmp_path, env):
    """Fixed at llama.cpp's defaults, the knobs leave the space (its digest, so stored studies resume) and
    the command as they were: no --load-mode, no --cache-reuse."""
    ctx = prepare(load_spec(spaced(tmp_path)))
    assert ctx.space.defaults == {"cache_reuse": 0, "mmap": "on", "mlock": "off"}
    assert not {"mmap", "mlock", "cache_reuse"} & set(ctx.space.domains)
    without = yaml.safe_load(DEFAULT_SPACE.read_text())
    for knob in ("mmap", "mlock", "cache_reuse"):
        without.pop(knob)
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(without))
    old = tmp_path / "old"
    old.mkdir()
    path = write_study(
        old,
        f"sqlite:///{old / 'studies.db'}",
        search_space={"file": str(tmp_path / "old.yaml"), "overrides": {"spec_type": ["none"], "threads": 1}},
    )
    assert prepare(load_spec(path)).space.digest() == ctx.space.digest()
    flags = options(build_server_command(baseline_config(ctx.space), ctx.launch))
    assert "--load-mode" not in flags and "--cache-reuse" not in flags


@pytest.mark.parametrize(
    ("mmap", "mlock", "mode"),
    [("on", "off", "mmap"), ("off", "off", "none"), ("on", "on", "mmap+mlock"), ("off", "on", "mlock")],
)
def test_searched_memory_knobs_reach_the_argv_as_the_pinned_load_mode(tmp_path, env, mmap, mlock, mode):
    # a bare YAML on/off (a boolean) reads as the knob's value
    text = (
        spaced(tmp_path)
        .read_text()
        .replace("threads: 1", "threads: 1\n    mmap: [on, off]\n    mlock: [off, on]")
    )
    path = tmp_path / "study.yaml"
    path.write_text(text.replace("spec_type:", "cache_reuse: [0, 256]\n    spec_type:"))
    ctx = prepare(load_spec(path))
    assert ctx.space.domains["mmap"].values == ("on", "off") and ctx.space.domains["mlock"].values == (
        "off",
        "on",
    )
    base = baseline_config(ctx.space)  # llama.cpp's defaults: the quality reference
    assert (base.mmap, base.mlock, base.cache_reuse) == ("on", "off", 0)
    trial = optuna.trial.FixedTrial(
        {
            "spec_type": "none",
            "numa": "none",
            "threads": 1,
            "temperature": 0.0,
            "mmap": mmap,
            "mlock": mlock,
            "cache_reuse": 256,
        }
    )
    flags = options(build_server_command(suggest(trial, ctx.space), ctx.launch))
    assert flags["--load-mode"] == mode and flags["--cache-reuse"] == "256"


def test_a_memory_knob_that_is_not_on_or_off_is_one_line(tmp_path, env):
    with pytest.raises(UserError) as err:
        load_spec(spaced(tmp_path, mmap=["on", "sometimes"]))
    assert "\n" not in str(err.value) and "mmap[1]: expected on or off, got 'sometimes'" in str(err.value)


def test_smaps_rollup_fields_and_doctors_advice_from_them():
    text = "55-7f ---p 0 00:00 0 [rollup]\nRss:  2048 kB\nAnonymous:  1024 kB\nAnonHugePages:  1024 kB\n"
    assert parse_smaps_rollup(text) == {"Rss": 2048, "Anonymous": 1024, "AnonHugePages": 1024}
    small = {"thp_mode": "madvise", "smaps_kib": {"Rss": 1000, "AnonHugePages": 0, "FilePmdMapped": 20}}
    huge = {"thp_mode": "always", "smaps_kib": {"Rss": 1000, "AnonHugePages": 900, "FilePmdMapped": 0}}
    (line,) = thp_measured("s", [small], "madvise")
    assert "THP madvise, at most 2% of a server's memory in huge pages" in line and "never asks" in line
    (line,) = thp_measured("s", [small, huge], "always")
    assert "THP always/madvise, at most 90%" in line and "huge pages backed the weights" in line
    (line,) = thp_measured("s", [{**small, "thp_mode": "never"}], "never")
    assert "THP is off" in line
    assert "no trial recorded" in thp_measured("s", [{"thp_mode": "never"}], "never")[0]


def test_mmap_off_reaches_llama_server_and_the_record_says_which_pages_were_huge(
    tmp_path, synthetic_models, monkeypatch
):
    """One short launch of the synthetic target with its weights read into memory (mmap: off) and prompt
    chunks reused: the flags reach llama-server, which says so, and the record carries THP's mode and the
    server's memory after the workload, the weights in its anonymous pages."""
    monkeypatch.setenv("TUNER_STORAGE_DIR", str(tmp_path / "storage"))
    (tmp_path / "one.yaml").write_text(
        yaml.safe_dump({"prompts": [{"id": "one", "text": "def add(a, b):\n"}]})
    )
    study = {
        "name": "mem",
        "target": str(models_dir() / "synthetic" / "target.gguf"),
        "search_space": {"overrides": {"spec_type": "none", "threads": 1, "mmap": "off", "cache_reuse": 64}},
        "workload": {"suites": ["one.yaml"], "n_predict": 4},
        "measurement": {"warmup": 0, "repetitions": 1, "ctx_size": 256, "trial_timeout_s": 120},
        "storage": f"sqlite:///{tmp_path / 'studies.db'}",
        "budget": {"trials": 1},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study))
    spec = load_spec(tmp_path / "study.yaml")
    record = store.read_trial(run_study(spec, progress=Progress.quiet()).trials[0])
    assert record.complete, record.failure
    flags = options(record.command)
    assert flags["--load-mode"] == "none" and flags["--cache-reuse"] == "64"
    log = (tmp_path / "storage" / "logs" / "mem" / "trial-0.log").read_text()
    assert "load_mode = none" in log
    memory = record.host["smaps_kib"]
    assert {"Rss", "Anonymous", "AnonHugePages", "FilePmdMapped"} <= set(memory)
    weights = prepare(spec).target.weights_bytes
    assert memory["Anonymous"] * 1024 >= weights  # read into the server's own memory, not mapped
    assert record.host["thp_mode"] == read_thp_mode()


def test_a_configuration_that_cannot_fit_is_a_check_line_and_is_never_launched(
    synthetic_models, tmp_path, env, capsys
):
    """The built-in target at 16 million tokens of context (a 262 GB KV cache): `--check` says it does not fit,
    with the sizes and the memory here, and a run fails its baseline as does_not_fit without a launch."""
    from tuner.cli import main

    study = write_study(
        tmp_path,
        f"sqlite:///{tmp_path / 'studies.db'}",
        target=str(synthetic_models.path("target")),
        drafts=[],
        search_space={"overrides": {"spec_type": ["none"], "threads": 1, "temperature": 0.0}},
        measurement={"warmup": 0, "repetitions": 1, "ctx_size": 16_000_000, "trial_timeout_s": 5},
    )
    assert main(["run", str(study), "--check"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("memory"))
    assert (
        "DOES NOT FIT" in line and "KV cache 262.14 GB for 16000000 tokens" in line and "GB available" in line
    )
    assert main(["run", str(study), "--trials", "1"]) == 2
    assert "does_not_fit: does not fit in memory: needs" in capsys.readouterr().err
    assert not Path(env["FAKE_LLAMA_LAUNCHES"]).exists()  # nothing was launched


def test_the_footprint_counts_weights_draft_and_both_kv_caches_and_a_bind_node_alone(synthetic_models):
    from tuner.machine.topology import NumaNode, read_topology
    from tuner.models.gguf_info import read_model_info
    from tuner.models.memory_fit import MARGIN_BYTES, footprint, misfit

    target, draft = (read_model_info(synthetic_models.path(n)) for n in ("target", "draft-large"))
    size = footprint(target, draft, 4096, "q8_0", "q8_0")
    kv = (target.kv_elements_per_token + draft.kv_elements_per_token) * 4096 * 34 / 32
    assert (
        size.kv_cache == round(kv)
        and size.weights == target.weights_bytes
        and size.draft == draft.weights_bytes
    )
    assert size.total == size.weights + size.draft + size.kv_cache + MARGIN_BYTES  # the margin's floor here
    assert footprint(target, None, 4096).kv_cache == target.kv_elements_per_token * 4096 * 2
    host = read_topology()
    small = replace(
        host, mem_available_bytes=size.total - 1, nodes=(NumaNode(0, (0,), size.total * 2, size.total // 2),)
    )
    assert "available on this host" in (misfit(size, small) or "")
    big = replace(small, mem_available_bytes=size.total * 4)
    assert misfit(size, big) is None and "free on NUMA node 0" in (misfit(size, big, node=0) or "")
