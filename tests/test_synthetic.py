"""The synthetic family: generated deterministically, and its landscape is real.

The landscape tests run the real pinned llama-server on the generated models. The
counts they assert on (acceptance, identical greedy text) are deterministic; the
speed ones compare each prompt's fastest request over interleaved rounds, and only
orderings that hold by a wide margin, so that they hold on a busy machine too.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from tuner.errors import UserError
from tuner.machine.llama_build import binary
from tuner.measurement.failures import FailureReason, TrialFailure
from tuner.measurement.server_process import LlamaServer, free_port
from tuner.measurement.workload import load_workload
from tuner.synthetic import copying, family, landscape, pinned, tables, weights
from tuner.synthetic.ngrams import NgramCounts
from tuner.synthetic.vocab import BYTE, NORMAL, train

# ---------------------------------------------------------------- pure Python


def test_vocab_training_is_deterministic_and_every_merge_is_reachable():
    text = "def read(self, path):\n    return self.path.read_text()\n" * 50
    first, second = train([text], 300, min_char_count=1), train([text], 300, min_char_count=1)
    assert first == second
    known = set()
    for token, kind, score in zip(first.tokens, first.types, first.scores):
        if kind == NORMAL and len(token) > 1:
            # SPM forms a token only by merging two tokens that exist, higher score first
            assert any(token[:i] in known and token[i:] in known for i in range(1, len(token))), token
            assert score < 0
        known.add(token)


def test_ngram_counts_survive_serialization_and_drop_singletons():
    seqs = [np.array([5, 6, 5, 6, 7]), np.array([5, 6])]
    counts = NgramCounts.count(seqs, n_vocab=8, distances=(1, 2), min_count=2)
    back = NgramCounts.from_bytes(counts.to_bytes())
    assert back.dense(1)[5, 6] == 3  # (5, 6) three times
    assert back.dense(1)[6, 5] == 0  # seen once: dropped
    assert back.dense(2)[5, 5] == 0 and back.dense(2)[6, 6] == 0  # once each
    assert back.unigram.tolist() == [0, 0, 0, 0, 0, 3, 3, 1]


def test_shipped_data_is_consistent_and_small():
    source = json.loads((pinned.DATA_DIR / pinned.SOURCE_FILE).read_text())
    counts, voc = pinned.load_counts(), pinned.load_vocab()
    assert len(voc) == counts.n_vocab == source["vocab_size"]
    assert int(counts.unigram.sum()) == source["tokens"]
    assert sum(p.stat().st_size for p in pinned.DATA_DIR.iterdir()) < 3_000_000


def test_copied_tokens_counts_output_runs_of_four_found_in_the_prompt():
    prompt = [1, 2, 3, 4, 5, 6, 7]
    assert copying.copied_tokens(prompt, [9, 2, 3, 4, 5, 9]) == 4
    assert copying.copied_tokens(prompt, [2, 3, 4, 9, 5, 6, 7]) == 0  # runs of three count for nothing
    assert copying.copied_tokens(prompt, [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4]) == 11  # overlapping windows
    assert copying.copied_tokens(prompt, []) == 0 and copying.copied_tokens([1, 2], [1, 2]) == 0


def test_copy_head_definition_follows_the_earlier_occurrence():
    """The float64 definition: the token after an earlier occurrence of the last two tokens gains the
    full strength; with no earlier occurrence the head adds (almost) nothing."""
    copy = weights.Copy(strength=5.0, width=32, context=2)
    codes = weights.token_codes(4096, 32)
    context = [1, 700, 800, 900, 1000, 1100, 800, 900]
    boost = weights.copy_logits(copy, codes, context)
    assert int(boost.argmax()) == 1000 and boost[1000] == pytest.approx(5.0, abs=0.1)
    assert np.abs(weights.copy_logits(copy, codes, [1, 700, 800, 900, 1000])).max() < 0.5
    narrow = weights.token_codes(4096, 16)
    assert np.allclose(narrow, codes[:, :16] / np.linalg.norm(codes[:, :16], axis=1, keepdims=True))


def test_spec_errors_name_the_member_and_the_field(tmp_path):
    text = (pinned.DATA_DIR / family.SPEC_FILE).read_text()
    bad = tmp_path / "models.yaml"
    bad.write_text(text.replace("role: draft\n", "role: drafty\n", 1))
    with pytest.raises(UserError, match=r"member 'draft-large': role must be one of"):
        family.load_spec(bad)
    bad.write_text(text.replace("targets: [target, moe-target]", "targets: [draft-small]", 1))
    with pytest.raises(UserError, match=r"'targets' entry 'draft-small' is not a target"):
        family.load_spec(bad)
    bad.write_text(text.replace("copy: {strength: 7.0, width: 16", "copy: {strength: 7.0, width: 40", 1))
    with pytest.raises(
        UserError, match=r"member 'draft-large': noise/moe/copy: copy: width must be in 1..32"
    ):
        family.load_spec(bad)


# ---------------------------------------------------------------- generation


def test_generation_is_deterministic_small_and_skipped_when_current(synthetic_models, tmp_path):
    fresh = family.generate(tmp_path / "family")
    assert sum(m.size for m in fresh.models) < 150_000_000
    # same bytes as the session's family, generated by another process earlier
    assert fresh.stamp == synthetic_models.stamp
    assert [m.sha256 for m in fresh.models] == [m.sha256 for m in synthetic_models.models]
    assert {m.role for m in fresh.models} == set(family.ROLES)

    mtimes = {m.name: m.path.stat().st_mtime_ns for m in fresh.models}
    again = family.generate(tmp_path / "family")
    assert {m.name: m.path.stat().st_mtime_ns for m in again.models} == mtimes

    damaged = fresh.path("draft-small")
    damaged.write_bytes(damaged.read_bytes()[:100])
    repaired = family.generate(tmp_path / "family")
    assert repaired.model("draft-small").sha256 == fresh.model("draft-small").sha256
    assert damaged.stat().st_size == fresh.model("draft-small").size


def test_index_pairs_targets_with_drafts(synthetic_models):
    loaded = family.load(synthetic_models.directory)
    assert loaded == synthetic_models
    assert set(loaded.drafts_for("target")) == {"draft-large", "draft-small"}
    assert set(loaded.drafts_for("moe-target")) == {"draft-large", "draft-small"}
    assert family.Pair("target", "incompatible-draft", False) in loaded.pairs


def test_llama_tokenize_reads_the_vocabulary_back(synthetic_models):
    text = "    def get(self, key, default=None):\n        return self.data.get(key, default)  # é\n"
    out = subprocess.run(
        [
            str(binary("llama-tokenize")),
            "-m",
            str(synthetic_models.path("target")),
            "-p",
            text,
            "--ids",
            "--no-bos",
            "--no-escape",
            "--log-disable",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ids = json.loads(out.strip().splitlines()[-1])
    voc = pinned.load_vocab()
    assert voc.decode(ids) == text
    assert len(ids) < len(text) / 2.5  # merges happened
    assert any(voc.types[i] == BYTE for i in ids)  # é falls back to bytes


def test_llama_cpp_computes_what_the_draft_is_defined_to_compute(synthetic_models, tmp_path):
    """draft-large's greedy text in llama.cpp equals its float64 definition (n-gram terms and
    copy head), token by token, up to the first near-tie (which quantization may break either
    way); on prompts that quote themselves the copy head decides some of the tokens."""
    spec = family.load_spec()
    member = spec.member("draft-large")
    assert member.copy is not None
    factors = tables.member_factors(
        tables.factorize(pinned.load_counts(), spec.stats), member.bigram_rank, member.skip
    )
    codes = weights.token_codes(factors.bigram.left.shape[0], member.copy.width)
    argv = landscape.Launch(synthetic_models.path("draft-large")).argv()
    compared = copied = 0
    quoting = [p.text or "" for p in load_workload(["summarize"], Path(".")).prompts[:2]]
    with LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=60) as server:
        for prompt in landscape.code_prompts()[:3] + quoting:
            prompt_ids = copying.tokenize(server.url, prompt, add_special=True)
            got = server.complete(prompt, 24, 0.0, 1).tokens
            context = list(prompt_ids)
            for token in got:
                ngram = factors.logits(context[-2], context[-1])
                z = ngram + weights.copy_logits(member.copy, codes, context)
                top2 = np.sort(z)[-2:]
                if top2[1] - top2[0] < 0.05:
                    break
                assert token == int(z.argmax())
                copied += token != int(ngram.argmax())
                context.append(token)
                compared += 1
    assert compared >= 60 and copied >= 3, (compared, copied)


def test_the_target_quotes_its_prompt_and_the_drafts_quote_less(synthetic_models):
    """The copy head in llama.cpp: greedy (deterministic) copy shares on the suites that quote. The target
    quotes (0.47 of its summary tokens, 0.54 of its edits when recorded), draft-large far less (a 1-token
    context at half the strength), draft-small (no copy head) least."""
    shares = {
        name: copying.measure_shares(synthetic_models.path(name), ("summarize", "code-edit"))
        for name in ("target", "draft-large", "draft-small")
    }
    for suite in ("summarize", "code-edit"):
        target, large, small = (
            shares[name][suite].share for name in ("target", "draft-large", "draft-small")
        )
        assert target >= 0.3 and large <= target / 2 and small <= large, (suite, target, large, small)


# ---------------------------------------------------------------- landscape

K_GRID = (1, 2, 4, 8, 16, 32)  # 1 and 32 are both well below the best
SMALL_K_GRID = (2, 4, 8)
ROUNDS = 3


@pytest.fixture(scope="module")
def measured(synthetic_models):
    """Points keyed by (config, temperature): one per round, over the landscape's default prompts.

    The rounds interleave the configurations, so a busy minute slows some of each one's
    requests, not all of one's. One thread per server: two spin-wait on each other
    whenever a busy machine preempts one, which once made the baseline 20 times slower.
    Temperature 0.7 only counts acceptance: it is measured once.
    """
    fam = synthetic_models
    target, large, small, moe = (fam.path(n) for n in ("target", "draft-large", "draft-small", "moe-target"))
    timed = {
        "base": landscape.Launch(target, threads=1),
        **{("large", k): landscape.Launch(target, large, k, threads=1) for k in K_GRID},
        **{("small", k): landscape.Launch(target, small, k, threads=1) for k in SMALL_K_GRID},
        "moe": landscape.Launch(moe, threads=1),
        "moe-1": landscape.Launch(moe, experts=1, threads=1),
    }
    also_warm = {"base", ("large", 4)}
    prompts = landscape.code_prompts()
    points: dict = {}
    for round_ in range(ROUNDS):
        for name, launch in timed.items():
            temperatures = (0.0, 0.7) if round_ == 0 and name in also_warm else (0.0,)
            for p in landscape.measure(launch, prompts, temperatures):
                points.setdefault((name, p.temperature), []).append(p)
    return points


def fastest(points: list[landscape.Point]) -> float:
    """Tokens/s of a configuration: the median prompt's fastest request over the rounds
    (a busy machine only ever slows a request down)."""
    return statistics.median(max(speeds) for speeds in zip(*(p.speeds for p in points)))


def test_every_round_repeats_the_counts_and_the_text_exactly(measured):
    """Greedy decoding is deterministic: between rounds only the speed may differ."""
    for key, points in measured.items():
        assert len({(p.drafted, p.accepted, p.texts) for p in points}) == 1, key


def test_best_draft_acceptance_is_in_band_and_falls_with_k(measured):
    acceptance = [measured[(("large", k), 0.0)][0].acceptance for k in K_GRID]
    assert 0.40 <= measured[(("large", 4), 0.0)][0].acceptance <= 0.95, acceptance
    assert all(a > b for a, b in zip(acceptance, acceptance[1:])), acceptance


def test_temperature_lowers_acceptance(measured):
    assert measured[(("large", 4), 0.7)][0].acceptance < measured[(("large", 4), 0.0)][0].acceptance - 0.05


def test_smaller_draft_accepts_less(measured):
    assert measured[(("small", 4), 0.0)][0].acceptance < measured[(("large", 4), 0.0)][0].acceptance - 0.05


def test_longer_drafts_pay_off_for_the_better_draft_more(measured):
    """Draft and K interact: from K=2 to K=8 the large draft gains speed, the small one
    (accepting less) loses it. The ratio of the two gains does not depend on the target's
    speed: 1.5 to 2.6 on a busy 2-core machine (1 would be no interaction)."""
    gain = {
        draft: fastest(measured[((draft, 8), 0.0)]) / fastest(measured[((draft, 2), 0.0)])
        for draft in ("large", "small")
    }
    assert gain["large"] >= 1.2 * gain["small"], gain


def test_greedy_output_is_identical_with_and_without_a_draft(measured):
    base = measured[("base", 0.0)][0].texts
    assert all(len(t) > 50 for t in base)
    for config in [("large", k) for k in K_GRID] + [("small", k) for k in SMALL_K_GRID]:
        assert measured[(config, 0.0)][0].texts == base, config


def test_draft_gains_saturate_with_k_and_long_drafts_fall_off(measured):
    """The shape of tokens/s against K: the gain saturates, the cost keeps growing.

    The gain side is in the counts (greedy, so identical on every host): accepted tokens grow
    from K=1 to K=8 and then stop growing while drafted tokens keep growing. The speed side
    asserted here is the fall: K=32 is far below the best. How far K=1 is below the best
    depends on the CPU at one thread, so it is not asserted: at least 1.2x on earlier hosts,
    1.07-1.36x on a Xeon with 480 MiB of L3, where the fastest-of-three metric put K=1 at
    0.99-1.01x the target alone and K=4 at 1.06-1.08x (a busy minute could swap them)."""
    base = fastest(measured[("base", 0.0)])
    speed = {k: fastest(measured[(("large", k), 0.0)]) / base for k in K_GRID}
    counts = {k: measured[(("large", k), 0.0)][0] for k in K_GRID}
    assert max(speed.values()) >= 1.3 * speed[K_GRID[-1]], speed
    accepted = {k: c.accepted for k, c in counts.items()}
    assert accepted[8] >= 1.3 * accepted[1], accepted
    assert accepted[32] <= 1.1 * accepted[8] and counts[32].drafted >= 2 * counts[8].drafted, counts


def test_one_expert_is_faster_and_changes_the_greedy_output(measured, synthetic_models):
    """On the landscape's code prompts the MoE target's copy head loops on prompt lines whatever its experts
    add (the same greedy text with 1 and 4 experts since the family quotes); on prose the n-grams still
    decide, and there the expert count changes the text."""
    default, one = measured[("moe", 0.0)], measured[("moe-1", 0.0)]
    assert fastest(one) >= 1.3 * fastest(default)
    prose = [p.text or "" for p in load_workload(["prose"], Path(".")).prompts]
    moe = synthetic_models.path("moe-target")
    texts = [
        landscape.measure(landscape.Launch(moe, experts=n, threads=1), prose)[0].texts for n in (None, 1)
    ]
    assert texts[0] != texts[1]


def test_incompatible_draft_serves_without_drafting(synthetic_models, tmp_path):
    launch = landscape.Launch(synthetic_models.path("target"), synthetic_models.path("incompatible-draft"), 4)
    (point,) = landscape.measure(launch, landscape.code_prompts()[:1], log_dir=tmp_path)
    assert point.drafted == 0 and point.texts[0]
    assert "the target and draft vocabs are not compatible" in (tmp_path / "server.log").read_text()


def test_corrupt_model_fails_to_load(synthetic_models, tmp_path):
    """llama.cpp's own verdict: Launch.argv reads the header first and would refuse the file itself."""
    argv = [str(binary("llama-server")), "-m", str(synthetic_models.path("corrupt")), "-t", "1", "--no-webui"]
    with pytest.raises(TrialFailure) as failure:
        with LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=60):
            pass
    assert failure.value.reason == FailureReason.MODEL_LOAD_FAILED


def test_recurrent_member_is_mamba_and_computes_the_small_drafts_text(synthetic_models):
    import gguf

    reader = gguf.GGUFReader(synthetic_models.path("recurrent"))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "mamba"
    prompts = landscape.code_prompts()[:2]
    recurrent, small = (
        landscape.measure(landscape.Launch(synthetic_models.path(name)), prompts, n_predict=24)[0]
        for name in ("recurrent", "draft-small")
    )
    assert recurrent.texts == small.texts and all(len(t) > 20 for t in small.texts)


# ---------------------------------------------------------------- scale members


def test_the_shipped_scale_members_read_over_a_gigabyte_a_token_and_pair_with_the_drafts():
    spec = family.load_scale_spec()
    for member in spec.members:
        hp = member.hp
        assert hp is not None
        per_layer = 4 * hp.n_embd**2 + 3 * hp.n_embd * hp.n_ff * max(hp.n_expert, 1)
        assert hp.n_layer * per_layer * 4 > 1e9  # F32: four bytes a weight
        assert member.weight_type == "F32" and member.seed_name in ("target", "moe-target")
    assert set(spec.inherited_pairs) == {
        (name, draft)
        for name in ("scale-target", "scale-moe-target")
        for draft in ("draft-large", "draft-small")
    }


def test_a_scale_member_predicts_what_its_base_target_predicts(synthetic_models, tmp_path):
    """The shipped dense scale member at a small shape (the same rule, seconds to make): llama.cpp's
    greedy text from it is the built-in target's, so the scale study keeps the target's landscape."""
    raw = yaml.safe_load((pinned.DATA_DIR / family.SCALE_SPEC_FILE).read_text())
    dense = next(m for m in raw["members"] if m["predicts_like"] == "target")
    small = tmp_path / "scale.yaml"
    small.write_text(yaml.safe_dump({"members": [{**dense, "n_embd": 1024, "n_layer": 2, "n_ff": 1024}]}))
    made = family.write_family(tmp_path / "scale", family.load_scale_spec(small), "test")
    assert set(made.drafts_for(dense["name"])) == {"draft-large", "draft-small"}
    prompts = landscape.code_prompts()[:2]
    scale, target = (
        landscape.measure(landscape.Launch(path), prompts, n_predict=32)[0]
        for path in (made.path(dense["name"]), synthetic_models.path("target"))
    )
    assert scale.texts == target.texts and all(len(t) > 20 for t in target.texts)


def test_scale_spec_errors_name_the_member_and_the_field(tmp_path):
    bad = tmp_path / "scale.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "members": [
                    {
                        "name": "big",
                        "file": "big.gguf",
                        "role": "target",
                        "predicts_like": "draft-large",
                        "n_embd": 1024,
                        "n_layer": 1,
                        "n_ff": 1024,
                    }
                ]
            }
        )
    )
    with pytest.raises(UserError, match=r"member 'big': 'predicts_like' must name a target"):
        family.load_scale_spec(bad)
