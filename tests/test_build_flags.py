"""A build's own flags and a launch's CPUs: the argv follows what the build's --help lists (the baseline says
``--no-spec-type`` where the build has it, a flag it lacks is one line), and a launch whose server threads leave the
CPUs its argv asked for is flagged (stand-in builds for the faults, the pinned build for its flags)."""

import json
import os
import re
from pathlib import Path

import pytest
from fake_llama_server import install, run_study_file, write_study

from tuner.errors import UserError
from tuner.knobs.config import TrialConfig
from tuner.machine.llama_build import server_flags
from tuner.machine.placement import pinning_problem
from tuner.machine.topology import read_topology
from tuner.measurement.launch import LaunchContext, asked_cpus, build_server_argv, compute_threads
from tuner.measurement.measured_launch import ServerLaunch, measured_launch
from tuner.run.trial_measurement import describe_trial
from tuner.storage import store

PINNED_HELP = (
    Path(__file__).parent / "data" / "llama-server-help.txt"
)  # the pinned build's `llama-server --help`
SPECULATES_BY_DEFAULT = (
    "--no-spec-type                          no speculative decoding (default: ngram-mod)\n"
)


def configs() -> list[TrialConfig]:
    """The baseline and each kind of speculation a study launches."""
    return [
        TrialConfig(threads=1),
        TrialConfig(spec_type="draft-simple", draft="small", draft_max=4, draft_p_min=0.5, threads=1),
        TrialConfig(spec_type="ngram-mod", draft_max=8, ngram_key=24, threads=1),
        TrialConfig(spec_type="ngram-simple", draft_max=4, ngram_key=3, ngram_min_hits=2, threads=1),
        TrialConfig(
            spec_type="draft-simple",
            draft="small",
            draft_max=4,
            lookup="ngram-map-k",
            lookup_max=6,
            threads=1,
        ),
    ]


def context(flags: frozenset[str], numactl: str | None = None) -> LaunchContext:
    return LaunchContext(
        server_binary=Path("/opt/new/bin/llama-server"),
        target=Path("/models/target.gguf"),
        drafts={"small": Path("/models/small.gguf")},
        expert_override_key=None,
        topology=read_topology(Path(__file__).parent / "data" / "sysfs" / "two-socket-4node-smt"),
        numactl=numactl,
        ctx_size=2048,
        server_flags=flags,
        build="llama.cpp abc1234 (build 9000, /opt/new/bin)",
    )


def test_the_baseline_says_no_speculation_where_the_build_has_the_switch_and_a_missing_flag_is_one_line():
    listed = frozenset(
        flag for c in configs() for flag in build_server_argv(c, context(frozenset())) if flag[:2] == "--"
    )
    baseline, *speculative = configs()
    for numactl in (None, "/usr/bin/numactl"):
        new = context(listed | {"--no-spec-type"}, numactl)
        assert build_server_argv(baseline, new)[-1] == "--no-spec-type"
        assert all("--no-spec-type" not in build_server_argv(c, new) for c in speculative)
        # a build without the switch (the pinned one) launches the baseline as before: no speculation flag at all
        assert "--no-spec-type" not in build_server_argv(baseline, context(listed, numactl))
    # a build whose --help does not list a flag of ours: one line naming the build and the flag
    with pytest.raises(
        UserError, match=r"^llama.cpp abc1234 \(build 9000, /opt/new/bin\): .*--load-mode"
    ) as err:
        build_server_argv(TrialConfig(threads=1, mmap="off"), context(listed))
    assert "\n" not in str(err.value)
    # a build whose usage text lists nothing (not read) is not checked
    assert "--no-spec-type" not in build_server_argv(baseline, context(frozenset()))


@pytest.mark.llama
def test_the_pinned_build_lists_every_flag_we_launch_with(llama_bin_dir):
    flags = server_flags(llama_bin_dir / "llama-server")
    assert {"--threads", "--spec-type", "--cpu-mask", "--no-webui"} <= flags
    for config in configs():  # none raises: every flag of ours is the pinned build's
        build_server_argv(config, context(flags))
        build_server_argv(config, context(flags, "/usr/bin/numactl"))
    # every flag the argv builder can write, but the switch a build that speculates by default adds
    builder = Path(__file__).parents[1] / "tuner" / "measurement" / "launch.py"
    written = set(re.findall(r'"(--[a-z0-9-]+)"', builder.read_text()))
    assert written - flags == {"--no-spec-type"}
    assert set(PINNED_HELP.read_text().split()) >= {"--spec-type", "--cpu-strict"}  # the stand-in's copy


@pytest.mark.llama
def test_a_pinned_build_launch_under_numactl_keeps_every_thread_on_the_asked_cpu(synthetic_models, tmp_path):
    """numactl holds every thread of the real server to --physcpubind: nothing flagged."""
    from tuner.machine.host import numactl_path
    from tuner.machine.llama_build import binary

    numactl = numactl_path()
    if numactl is None:
        pytest.skip("numactl is not installed")
    first = min(os.sched_getaffinity(0))
    argv = [numactl, f"--physcpubind={first}", str(binary("llama-server")), "--model"]
    argv += [str(synthetic_models.path("target")), "--threads", "1", "--ctx-size", "256", "--no-webui"]
    launched = measured_launch(ServerLaunch(argv, tmp_path / "numactl.log", timeout_s=120))
    assert launched.unpinned is None


def test_a_stand_in_build_that_lists_no_spec_type_launches_the_baseline_with_it(tmp_path, env):
    """A build whose --help lists --no-spec-type (one that speculates by default): the baseline's stored argv
    carries it, a speculative trial's does not, and the study's build records the flags its --help lists."""
    usage = tmp_path / "usage.txt"
    usage.write_text(PINNED_HELP.read_text() + SPECULATES_BY_DEFAULT)
    warm = [{"spec_type": "draft-simple", "draft": "draft", "draft_max": 4, "temperature": 0.0, "threads": 1}]
    path = write_study(
        tmp_path, f"sqlite:///{tmp_path / 'studies.db'}", warm_start=warm, budget={"trials": 2}
    )
    study, _ = run_study_file(path, 2, FAKE_LLAMA_HELP=str(usage))
    records = store.read_trials(study)
    baseline = next(r for r in records if r.role == "baseline")
    speculative = [r for r in records if r.config.speculative and r.complete]
    assert "--no-spec-type" in baseline.argv and "--spec-type" not in baseline.argv
    assert speculative and all("--no-spec-type" not in r.argv for r in speculative)
    assert "--no-spec-type" in store.read_study_record(study).build["server_flags"]


def test_a_stand_in_build_without_a_flag_of_ours_stops_the_check_in_one_line(tmp_path, env, monkeypatch):
    from tuner.prepare import prepare
    from tuner.studyfile.spec import load_spec

    usage = tmp_path / "usage.txt"
    usage.write_text(PINNED_HELP.read_text().replace("--no-webui", "--webui-off"))
    monkeypatch.setenv("FAKE_LLAMA_HELP", str(usage))
    path = write_study(tmp_path, f"sqlite:///{tmp_path / 'studies.db'}")
    with pytest.raises(UserError) as err:
        prepare(load_spec(path))
    assert str(tmp_path / "bin") in str(err.value) and "does not list --no-webui" in str(err.value)


def stand_in_launch(folder: Path, mask: str) -> list[str]:
    return [str(install(folder / "bin")), "--cpu-mask", mask, "--cpu-strict", "1", "--threads", "1"]


def test_a_launch_whose_threads_leave_the_asked_cpus_is_flagged(tmp_path, env, monkeypatch):
    """The stand-in pins itself to --cpu-mask as llama.cpp does; with the fault `unpinned` it ignores the mask, as
    upstream once did. The launch that ignored it is flagged, the one that kept it is not."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: every thread is on the asked CPU")
    first = min(os.sched_getaffinity(0))
    argv = stand_in_launch(tmp_path, hex(1 << first))
    assert asked_cpus(argv) == {first}
    kept = measured_launch(ServerLaunch(argv, tmp_path / "kept.log"))
    assert kept.unpinned is None
    monkeypatch.setenv("FAKE_LLAMA_FAULTS", json.dumps({"--cpu-mask": "unpinned"}))
    ignored = measured_launch(ServerLaunch(argv, tmp_path / "ignored.log"))
    assert (
        ignored.unpinned is not None
        and f"held to the asked CPUs {first}, fewer than its 1" in ignored.unpinned
    )


def test_a_race_or_verify_launch_whose_threads_leave_the_asked_cpus_says_so(tmp_path, env, monkeypatch):
    """Race and verify launches re-measure through ``Remeasure``: the launch carries the flag, a line says it."""
    from tuner.decisions.remeasure import Contender, Remeasure
    from tuner.measurement.measure import MeasurementSettings
    from tuner.measurement.workload import Prompt, Workload
    from tuner.progress import Progress

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: every thread is on the asked CPU")
    monkeypatch.setenv("FAKE_LLAMA_FAULTS", json.dumps({"--cpu-mask": "unpinned"}))
    lines: list[str] = []
    workload = Workload((Prompt("p0", "code", "def add(a, b):"),))
    remeasure = Remeasure(
        workload, MeasurementSettings(n_predict=8, trial_timeout_s=30.0), tmp_path, Progress(lines.append)
    )
    argv = stand_in_launch(tmp_path, hex(1 << min(os.sched_getaffinity(0))))
    launched = remeasure.launch(Contender("trial-1", argv, 0.0))
    assert launched.unpinned and launched.rate > 0
    assert any(line.startswith("re-measuring trial-1: not pinned as asked (") for line in lines), lines


def test_a_trial_whose_threads_leave_the_asked_cpus_is_flagged_with_the_trial(tmp_path, env, monkeypatch):
    """Without numactl llama.cpp pins its own threads (--cpu-mask, --cpu-strict 1); a build that ignores the mask
    leaves its trials flagged: stored with the trial and said in its progress line."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: every thread is on the asked CPU")
    monkeypatch.setattr("tuner.prepare.study.numactl_path", lambda: None)
    path = write_study(tmp_path, f"sqlite:///{tmp_path / 'studies.db'}", budget={"trials": 1})
    study, _ = run_study_file(path, 1, FAKE_LLAMA_FAULTS=json.dumps({"--cpu-mask": "unpinned"}))
    baseline = store.read_trials(study)[0]
    assert "--cpu-mask" in baseline.argv and baseline.host["unpinned"]
    assert f"(not pinned as asked: {baseline.host['unpinned']})" in describe_trial(baseline)


def test_the_pinning_rule_counts_the_threads_held_to_the_asked_cpus():
    """llama.cpp pins its compute threads and leaves its HTTP threads anywhere (the pinned build, 2 threads on
    --cpu-mask 0x1: 2 of 13 threads on CPU 0, the rest on 0-1); fewer held threads than it computes on is flagged."""
    anywhere = {tid: frozenset({0, 1}) for tid in range(11)}
    assert pinning_problem({0}, {100: frozenset({0}), 101: frozenset({0}), **anywhere}, 2) is None
    problem = pinning_problem({0}, {100: frozenset({0}), **anywhere}, 2)
    assert (
        problem
        == "1 of 12 server threads held to the asked CPUs 0, fewer than its 2 compute threads; the others may run on 1"
    )
    assert pinning_problem(frozenset(), anywhere, 2) is None  # nothing asked: nothing to hold to
    assert asked_cpus(["numactl", "--physcpubind=2-3,6", "llama-server"]) == {2, 3, 6}
    assert asked_cpus(["llama-server", "--threads", "2"]) == frozenset()
    assert compute_threads(["llama-server", "--threads", "2", "--threads-batch", "4"]) == 4
    assert compute_threads(["llama-server"]) == 1
