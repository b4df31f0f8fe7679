"""argv construction for every knob, on recorded one-node and multi-node topologies."""

from pathlib import Path

import pytest

from tuner.knobs.config import TrialConfig
from tuner.machine.topology import read_topology
from tuner.measurement.failures import FailureReason, TrialFailure
from tuner.measurement.launch import LaunchContext, build_server_argv

SYSFS = Path(__file__).parent / "data" / "sysfs"


def context(tree: str, numactl: str | None = "/usr/bin/numactl", **kw) -> LaunchContext:
    return LaunchContext(
        server_binary=Path("/opt/llama/bin/llama-server"),
        target=Path("/models/target.gguf"),
        drafts={"small": Path("/models/small.gguf")},
        expert_override_key=kw.pop("expert_key", None),
        topology=read_topology(SYSFS / tree),
        numactl=numactl,
        ctx_size=2048,
        **kw,
    )


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_baseline_pins_physical_cores_with_numactl():
    argv = build_server_argv(TrialConfig(threads=4), context("two-socket-4node-smt"))
    assert argv[:2] == ["/usr/bin/numactl", "--physcpubind=0-3"]
    assert argv[2] == "/opt/llama/bin/llama-server"
    assert flag(argv, "--threads") == "4" and flag(argv, "--threads-batch") == "4"
    assert "--spec-type" not in argv and "--numa" not in argv and "--override-kv" not in argv
    assert all(isinstance(a, str) for a in argv)


def test_batch_threads_get_a_cpu_each():
    """llama.cpp runs prompts and speculative verification batches on --threads-batch threads: pinned to the
    decode threads' CPUs they oversubscribe them (a 16-core host decoded 5 times slower)."""
    argv = build_server_argv(TrialConfig(threads=4, threads_batch=8), context("two-socket-4node-smt"))
    assert (
        argv[1] == "--physcpubind=0-7"
        and flag(argv, "--threads") == "4"
        and flag(argv, "--threads-batch") == "8"
    )


def test_threads_span_nodes_before_any_smt_sibling():
    argv = build_server_argv(TrialConfig(threads=32), context("two-socket-4node-smt"))
    assert argv[1] == "--physcpubind=0-31"  # siblings are 32-63: none chosen


def test_smt_siblings_only_when_allowed():
    with pytest.raises(TrialFailure) as err:
        build_server_argv(TrialConfig(threads=40), context("two-socket-4node-smt"))
    assert err.value.reason is FailureReason.INVALID_CONFIG
    argv = build_server_argv(TrialConfig(threads=40), context("two-socket-4node-smt", allow_smt=True))
    assert argv[1] == "--physcpubind=0-39"


def test_numa_interleave_and_bind():
    ctx = context("two-socket-4node-smt")
    inter = build_server_argv(TrialConfig(threads=8, numa="interleave"), ctx)
    assert "--interleave=all" in inter and flag(inter, "--numa") == "numactl"
    bind = build_server_argv(TrialConfig(threads=4, numa="bind", numa_node=2), ctx)
    assert "--membind=2" in bind and flag(bind, "--numa") == "numactl"
    node2 = read_topology(SYSFS / "two-socket-4node-smt").node(2).cpus
    pinned = [int(c) for c in bind[1].split("=")[1].split("-")]
    assert set(range(pinned[0], pinned[-1] + 1)) <= set(node2)
    with pytest.raises(TrialFailure):  # a node has 8 physical cores
        build_server_argv(TrialConfig(threads=9, numa="bind", numa_node=0), ctx)


@pytest.mark.parametrize("policy", ["distribute", "isolate"])
def test_llama_numa_strategies(policy):
    argv = build_server_argv(TrialConfig(threads=2, numa=policy), context("two-socket-4node-smt"))
    assert flag(argv, "--numa") == policy
    assert not any(a.startswith("--interleave") or a.startswith("--membind") for a in argv)


def test_without_numactl_llama_pins_itself():
    ctx = context("one-node-2core", numactl=None)
    argv = build_server_argv(TrialConfig(threads=2), ctx)
    assert argv[0].endswith("llama-server")
    assert flag(argv, "--cpu-mask") == "0x3" and flag(argv, "--cpu-strict") == "1"
    with pytest.raises(TrialFailure):
        build_server_argv(TrialConfig(threads=1, numa="interleave"), ctx)


def test_draft_model_flags():
    config = TrialConfig(
        spec_type="draft-simple", draft="small", draft_max=8, draft_min=2, draft_p_min=0.5, threads=2
    )
    argv = build_server_argv(config, context("one-node-2core"))
    assert flag(argv, "--spec-type") == "draft-simple"  # -md alone does not draft in this llama.cpp
    assert flag(argv, "--spec-draft-model") == "/models/small.gguf"
    assert flag(argv, "--spec-draft-n-max") == "8"
    assert flag(argv, "--spec-draft-n-min") == "2"
    assert flag(argv, "--spec-draft-p-min") == "0.5"
    assert flag(argv, "--spec-draft-threads") == "2"


def test_unknown_draft_is_invalid():
    with pytest.raises(TrialFailure) as err:
        build_server_argv(
            TrialConfig(spec_type="draft-simple", draft="nope", draft_max=4), context("one-node-2core")
        )
    assert err.value.reason is FailureReason.INVALID_CONFIG


@pytest.mark.parametrize(
    "spec_type,k_flag",
    [
        ("ngram-simple", "--spec-ngram-simple-size-m"),
        ("ngram-map-k", "--spec-ngram-map-k-size-m"),
        ("ngram-map-k4v", "--spec-ngram-map-k4v-size-m"),
        ("ngram-mod", "--spec-ngram-mod-n-max"),
    ],
)
def test_ngram_types_carry_k_in_their_own_flag(spec_type, k_flag):
    argv = build_server_argv(
        TrialConfig(spec_type=spec_type, draft_max=6, threads=1), context("one-node-2core")
    )
    assert flag(argv, "--spec-type") == spec_type and flag(argv, k_flag) == "6"
    assert "--spec-draft-model" not in argv
    if spec_type == "ngram-mod":  # its default minimum (48) would exceed K
        assert int(flag(argv, "--spec-ngram-mod-n-min")) <= 6


def test_expert_override_uses_the_architecture_key():
    ctx = context("one-node-2core", expert_key="qwen3moe.expert_used_count")
    argv = build_server_argv(TrialConfig(experts=3, threads=1), ctx)
    assert flag(argv, "--override-kv") == "qwen3moe.expert_used_count=int:3"


def test_extra_args_are_appended_as_list_elements():
    ctx = context("one-node-2core", extra_args=("--mlock", "--cache-type-k", "q8_0"))
    argv = build_server_argv(TrialConfig(threads=1), ctx)
    assert argv[-3:] == ["--mlock", "--cache-type-k", "q8_0"]


def test_shell_syntax_is_inert():
    ctx = context("one-node-2core", extra_args=("; rm -rf /",))
    argv = build_server_argv(TrialConfig(threads=1), ctx)
    assert argv[-1] == "; rm -rf /"  # one argv element, never parsed by a shell


def test_a_stack_is_one_spec_type_list_with_each_part_sized():
    config = TrialConfig(
        spec_type="draft-simple",
        draft="small",
        draft_max=8,
        lookup="ngram-simple",
        lookup_max=5,
        ngram_key=3,
        ngram_min_hits=2,
        threads=2,
    )
    argv = build_server_argv(config, context("one-node-2core"))
    assert flag(argv, "--spec-type") == "ngram-simple,draft-simple"
    assert flag(argv, "--spec-draft-n-max") == "8"  # K stays the draft model's
    assert flag(argv, "--spec-ngram-simple-size-m") == "5"
    assert flag(argv, "--spec-ngram-simple-size-n") == "3"
    assert flag(argv, "--spec-ngram-simple-min-hits") == "2"
    assert argv.count("--spec-type") == 1


def test_stacked_ngram_mod_gets_its_match_length_and_a_minimum_below_its_length():
    config = TrialConfig(
        spec_type="draft-simple",
        draft="small",
        draft_max=4,
        lookup="ngram-mod",
        lookup_max=6,
        lookup_min=9,
        ngram_key=4,
        ngram_min_hits=3,
        threads=1,
    )
    argv = build_server_argv(config, context("one-node-2core"))
    assert flag(argv, "--spec-type") == "ngram-mod,draft-simple"
    assert flag(argv, "--spec-ngram-mod-n-match") == "4" and flag(argv, "--spec-ngram-mod-n-max") == "6"
    assert flag(argv, "--spec-ngram-mod-n-min") == "6"  # clamped to its draft length
    assert not any("min-hits" in a for a in argv)  # ngram-mod has no minimum hits


def test_lone_lookup_sizes_use_k_as_the_draft_length_and_none_means_no_stack():
    config = TrialConfig(spec_type="ngram-map-k", draft_max=7, ngram_key=2, lookup="none", threads=1)
    argv = build_server_argv(config, context("one-node-2core"))
    assert flag(argv, "--spec-type") == "ngram-map-k"
    assert flag(argv, "--spec-ngram-map-k-size-m") == "7" and flag(argv, "--spec-ngram-map-k-size-n") == "2"
    assert "--spec-ngram-map-k-min-hits" not in argv  # unset: llama.cpp's default
