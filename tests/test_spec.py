"""Study and search-space validation: every bad field is one line naming file and field."""

from pathlib import Path

import pytest
import yaml
from gguf_factory import bpe_tokens, write_gguf

from tuner.cli import main
from tuner.errors import UserError
from tuner.knobs.config import Choices, IntRange
from tuner.machine.topology import read_topology
from tuner.prepare.fitted_space import check_models_and_space
from tuner.studyfile.spec import load_spec

REPO = Path(__file__).resolve().parent.parent
SYSFS = Path(__file__).parent / "data" / "sysfs"
ONE_NODE = read_topology(SYSFS / "one-node-2core")
FOUR_NODES = read_topology(SYSFS / "two-socket-4node-smt")


@pytest.fixture
def models(tmp_path):
    """Metadata-only stand-ins: a target, a compatible draft, an incompatible one, an MoE."""
    d = tmp_path / "models"
    d.mkdir()
    write_gguf(d / "target.gguf")
    write_gguf(d / "draft.gguf")
    write_gguf(d / "other-vocab.gguf", tokenizer_model="gpt2", tokens=bpe_tokens())
    write_gguf(d / "moe.gguf", architecture="qwen3moe", expert_count=8, expert_used_count=4)
    return d


def write_study(tmp_path: Path, models: Path, **fields) -> Path:
    study = {
        "name": "t",
        "target": str(models / "target.gguf"),
        "drafts": [str(models / "draft.gguf")],
        "search_space": {"overrides": {"spec_type": ["none", "draft-simple"], "draft_max": [2, 4]}},
    }
    study.update(fields)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def error_of(path: Path, topo=ONE_NODE) -> str:
    with pytest.raises(UserError) as err:
        spec = load_spec(path)
        check_models_and_space(spec, topo, "/usr/bin/numactl")
    message = str(err.value)
    assert "\n" not in message
    return message


def test_valid_study_resolves_for_this_machine(tmp_path, models):
    spec = load_spec(write_study(tmp_path, models))
    target, drafts, space = check_models_and_space(spec, ONE_NODE, None)
    assert list(drafts) == ["draft"]
    assert space.domains["spec_type"] == Choices(("none", "draft-simple"))
    assert space.domains["threads"] == IntRange(1, 2)
    assert space.domains["numa"] == Choices(("none",))
    assert "experts" not in space.domains
    assert [o.metric for o in spec.objectives] == ["tokens_per_second", "acceptance", "quality"]


def test_race_loss_is_the_price_an_operator_sets(tmp_path, models):
    spec = load_spec(write_study(tmp_path, models, race={"loss": 0.03, "max_rounds": 20}))
    assert spec.race.loss == 0.03 and spec.race.max_rounds == 20 and spec.race.confirm_rounds == 0
    assert spec.race.expected_loss == 0.002  # the default stop: more rounds would rarely change the pick
    off = load_spec(write_study(tmp_path, models, race={"expected_loss": 0}))
    assert off.race.expected_loss == 0.0 and off.race.max_rounds == 11
    message = error_of(write_study(tmp_path, models, race={"expected_loss": -0.1}))
    assert "race.expected_loss" in message and "must be >= 0" in message


def test_numa_choices_collapse_on_one_node_and_stay_on_four(tmp_path, models):
    path = write_study(
        tmp_path, models, search_space={"overrides": {"numa": ["none", "interleave", "bind", "distribute"]}}
    )
    _, _, one = check_models_and_space(load_spec(path), ONE_NODE, "/usr/bin/numactl")
    assert one.domains["numa"] == Choices(("none",))
    assert any("not meaningful" in n for n in one.notes)
    _, _, four = check_models_and_space(load_spec(path), FOUR_NODES, "/usr/bin/numactl")
    assert four.domains["numa"] == Choices(("none", "interleave", "bind", "distribute"))
    assert four.domains["numa_node"] == Choices((0, 1, 2, 3))
    assert four.domains["threads"] == IntRange(1, 32)


def test_moe_target_gets_expert_knob(tmp_path, models):
    path = write_study(tmp_path, models, target=str(models / "moe.gguf"), drafts=[])
    _, _, space = check_models_and_space(load_spec(path), ONE_NODE, None)
    assert space.domains["experts"] == IntRange(1, 4)
    assert space.default_experts == 4
    assert "draft" not in space.domains


@pytest.mark.parametrize(
    "fields,expected",
    [
        ({"bogus": 1}, "study.yaml: bogus: unknown field"),
        ({"budget": {"trials": "many"}}, "budget.trials: expected an integer"),
        ({"budget": {"trials": 0}}, "budget.trials: must be >= 1"),
        ({"search_space": {"overrides": {"draft_max": []}}}, "search_space.draft_max: empty list"),
        (
            {"search_space": {"overrides": {"draft_max": {"low": 8, "high": 2}}}},
            "draft_max: empty range: low 8 > high 2",
        ),
        (
            {"search_space": {"overrides": {"draft_max": {"low": -1, "high": 2}}}},
            "draft_max.low: must not be negative",
        ),
        (
            {
                "search_space": {
                    "overrides": {"temperature": {"low": 0.1, "high": 1, "step": 0.1, "log": True}}
                }
            },
            "step and log",
        ),
        ({"search_space": {"overrides": {"kk": [1]}}}, "search_space.kk: unknown knob"),
        ({"search_space": {"overrides": {"spec_type": ["eagle"]}}}, "unknown speculative type 'eagle'"),
        (
            {"search_space": {"overrides": {"threads": {"low": 1, "high": 64}}}},
            "search_space.threads: 64 threads exceed the 2",
        ),
        ({"target": "missing.gguf"}, "target: "),
        ({"quality": {"scorer": "vibes"}}, "quality.scorer: unknown value 'vibes'"),
        ({"quality": {"floor": 1.5}}, "quality.floor: must be <= 1.0"),
        ({"quality": {"scorer": "perplexity"}}, "quality.text_file: the perplexity scorer needs"),
        ({"objectives": [{"metric": "speed"}]}, "objectives[0].metric: unknown value 'speed'"),
        ({"llama_cpp": {"extra_args": "--mlock; rm -rf /"}}, "llama_cpp.extra_args: expected a list"),
        ({"warm_start": [{"kay": 3}]}, "warm_start[0].kay: unknown knob"),
        ({"race": {"equivalence": 0.02}}, "race.equivalence: the race bounds a loss now: set loss"),
        ({"race": {"loss": 0.9}}, "race.loss: must be <= 0.5"),
    ],
)
def test_bad_fields(tmp_path, models, fields, expected):
    assert expected in error_of(write_study(tmp_path, models, **fields))


def test_draft_mtp_is_offered_only_where_the_target_announces_it(tmp_path, models):
    """The default space file joins draft-mtp to its list for an MTP target; a study's own list is as written."""
    write_gguf(models / "mtp.gguf", block_count=2, nextn=True)
    default = {"file": str(REPO / "search_spaces" / "default.yaml")}
    _, _, mtp = check_models_and_space(
        load_spec(write_study(tmp_path, models, target=str(models / "mtp.gguf"), search_space=default)),
        ONE_NODE,
        None,
    )
    assert mtp.domains["spec_type"].values[-1] == "draft-mtp"
    assert "spec_type: draft-mtp added (mtp.gguf announces it)" in mtp.notes
    _, _, plain = check_models_and_space(
        load_spec(write_study(tmp_path, models, search_space=default)), ONE_NODE, None
    )
    assert "draft-mtp" not in plain.domains["spec_type"].values
    asked = {"overrides": {"spec_type": ["none", "draft-mtp"]}}
    _, _, own = check_models_and_space(
        load_spec(write_study(tmp_path, models, target=str(models / "mtp.gguf"), search_space=asked)),
        ONE_NODE,
        None,
    )
    assert own.domains["spec_type"] == Choices(("none", "draft-mtp"))
    path = write_study(tmp_path, models, search_space=asked)
    assert error_of(path) == (
        f"{path}: search_space.spec_type: target.gguf does not announce draft-mtp "
        "(`tuner inspect` lists the types a model announces); remove draft-mtp from spec_type"
    )


def test_incompatible_draft_is_refused(tmp_path, models):
    path = write_study(tmp_path, models, drafts=[str(models / "other-vocab.gguf")])
    message = error_of(path)
    assert "drafts[0]: other-vocab.gguf cannot draft" in message and "remove it" in message


def test_directory_and_non_gguf_targets(tmp_path, models):
    assert "is a directory" in error_of(write_study(tmp_path, models, target=str(models)))
    junk = models / "junk.gguf"
    junk.write_text("not a model")
    assert "junk.gguf" in error_of(write_study(tmp_path, models, target=str(junk)))


def test_malformed_yaml_and_missing_env(tmp_path, models, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    assert "bad.yaml: malformed YAML at line" in error_of(bad)
    monkeypatch.delenv("NO_SUCH_MODELS_DIR", raising=False)
    path = write_study(tmp_path, models, target="${NO_SUCH_MODELS_DIR}/t.gguf")
    assert "target: environment variable $NO_SUCH_MODELS_DIR is not set" in error_of(path)


def test_cli_bad_study_exits_nonzero_with_one_line(tmp_path, models, capsys):
    path = write_study(tmp_path, models, budget={"trials": -3})
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "budget.trials: must be >= 1" in err


@pytest.mark.parametrize("name", ["qwen25-coder-32b", "qwen3-coder-30b-a3b", "qwen25-72b"])
def test_example_studies_validate_with_stand_in_models(tmp_path, monkeypatch, name):
    """The research setups, pointed at metadata-only files with the real file names."""
    vocab = bpe_tokens()
    common = dict(tokenizer_model="gpt2", tokens=vocab, bos_id=None, eos_id=2, add_bos=False)
    write_gguf(tmp_path / "Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf", architecture="qwen2", **common)
    write_gguf(tmp_path / "Qwen2.5-72B-Instruct-Q4_K_M.gguf", architecture="qwen2", **common)
    write_gguf(tmp_path / "Qwen2.5-0.5B-Instruct-Q8_0.gguf", architecture="qwen2", **common)
    write_gguf(tmp_path / "Qwen2.5-Coder-0.5B-Instruct-Q8_0.gguf", architecture="qwen2", **common)
    write_gguf(
        tmp_path / "Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf",
        architecture="qwen3moe",
        expert_count=128,
        expert_used_count=8,
        **common,
    )
    monkeypatch.setenv("MODELS", str(tmp_path))
    spec = load_spec(REPO / "studies" / f"{name}.yaml")
    target, drafts, space = check_models_and_space(spec, FOUR_NODES, "/usr/bin/numactl")
    assert space.domains["numa"] == Choices(("none", "interleave", "bind", "distribute", "isolate"))
    assert ("experts" in space.domains) == target.is_moe
    if target.is_moe:
        assert space.domains["experts"] == IntRange(1, 8)
    assert len(drafts) == len(spec.drafts)
