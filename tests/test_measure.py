"""Score arithmetic on constructed samples: median, spread, noise flag, acceptance."""

from __future__ import annotations

import statistics

import pytest

from tuner.machine.llama_build import binary
from tuner.measurement.measure import MeasurementSettings, Sample, outputs_by_prompt, run_workload, summarize
from tuner.measurement.quality import agreement
from tuner.measurement.server_process import LlamaServer, free_port
from tuner.measurement.workload import Prompt, Workload


def sample(prompt_id="p", suite="code", repetition=0, n=100, ms=1000.0, draft_n=0, accepted=0, text="t"):
    return Sample(
        prompt_id=prompt_id,
        suite=suite,
        repetition=repetition,
        predicted_n=n,
        predicted_ms=ms,
        tokens_per_second=1000.0 * n / ms if ms else 0.0,
        draft_n=draft_n,
        draft_n_accepted=accepted,
        text=text,
        tokens=(repetition,),
    )


def test_rate_is_pooled_per_repetition_then_median():
    # repetition 0: (100 + 20) tokens in (1000 + 1000) ms = 60 tok/s, not the mean of 100 and 20
    samples = [
        sample("a", repetition=0, n=100, ms=1000),
        sample("b", repetition=0, n=20, ms=1000),
        sample("a", repetition=1, n=100, ms=500),
        sample("b", repetition=1, n=20, ms=500),
        sample("a", repetition=2, n=100, ms=1200),
        sample("b", repetition=2, n=20, ms=800),
    ]
    scores = summarize(samples, MeasurementSettings())
    assert scores.tokens_per_second == pytest.approx(60.0)
    rates = [60.0, 120.0, 60.0]
    assert scores.cv == pytest.approx(statistics.stdev(rates) / statistics.fmean(rates))
    assert scores.noisy  # cv ~0.43 > 0.10
    assert scores.n_samples == 6


def test_steady_repetitions_are_not_noisy_and_one_repetition_has_an_unknown_spread():
    steady = [sample(repetition=r, n=100, ms=ms) for r, ms in enumerate([1000, 1010, 990])]
    scores = summarize(steady, MeasurementSettings(noise_cv=0.10))
    assert scores.tokens_per_second == pytest.approx(100.0)
    assert 0 < scores.cv < 0.02 and not scores.noisy
    assert summarize(steady, MeasurementSettings(noise_cv=0.005)).noisy
    single = summarize([sample()], MeasurementSettings())
    assert single.cv is None and single.noisy is None and single.repetitions == 1  # unknown, not "not noisy"


def test_per_suite_rates_and_acceptance():
    samples = [
        sample("c", "code", 0, n=100, ms=500, draft_n=80, accepted=60),
        sample("s", "summarize", 0, n=100, ms=2000, draft_n=20, accepted=5),
        sample("c", "code", 1, n=100, ms=400, draft_n=80, accepted=60),
        sample("s", "summarize", 1, n=100, ms=2000, draft_n=20, accepted=5),
    ]
    scores = summarize(samples, MeasurementSettings())
    assert scores.per_suite_tokens_per_second == pytest.approx({"code": 225.0, "summarize": 50.0})
    assert (scores.drafted, scores.accepted) == (200, 130)
    assert scores.acceptance == pytest.approx(0.65)


def test_no_drafting_means_zero_acceptance_and_zero_time_means_zero_rate():
    scores = summarize([sample(n=0, ms=0.0)], MeasurementSettings())
    assert scores.acceptance == 0.0 and scores.drafted == 0
    assert scores.tokens_per_second == 0.0
    with pytest.raises(ValueError):
        summarize([], MeasurementSettings())


def test_outputs_by_prompt_takes_the_first_measured_repetition():
    samples = [sample("a", repetition=r, text=f"a{r}") for r in (1, 2)] + [
        sample("b", repetition=1, text="b1")
    ]
    outputs = outputs_by_prompt(samples)
    assert {k: v.text for k, v in outputs.items()} == {"a": "a1", "b": "b1"}


def test_run_workload_on_a_real_server(synthetic_models, tmp_path):
    workload = Workload(
        prompts=(Prompt("a", "code", "def flatten(items):\n"), Prompt("b", "prose", "The lighthouse keeper"))
    )
    settings = MeasurementSettings(warmup=1, repetitions=2, n_predict=12)
    argv = [
        str(binary("llama-server")),
        "-m",
        str(synthetic_models.path("draft-small")),
        "-t",
        "2",
        "-c",
        "512",
        "-np",
        "1",
        "--no-webui",
    ]
    hooked = []
    with LlamaServer(argv, free_port(), tmp_path / "server.log", ready_timeout_s=60) as server:
        samples = run_workload(
            server,
            workload,
            settings,
            temperature=0.0,
            after_request=lambda so_far, *flags: hooked.append((len(so_far), *flags)),
        )
    # the pruner's hook after every request: a pass's end marked, and whether another request follows
    assert hooked == [(1, False, True), (2, True, True), (3, False, True), (4, True, False)]
    assert [(s.prompt_id, s.repetition) for s in samples] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    assert all(0 < s.predicted_n <= 12 and s.predicted_ms > 0 for s in samples)
    scores = summarize(samples, settings)
    assert scores.tokens_per_second > 0 and set(scores.per_suite_tokens_per_second) == {"code", "prose"}
    assert (scores.n_samples, scores.drafted, scores.acceptance) == (4, 0, 0.0)
    first = {k: v.tokens for k, v in outputs_by_prompt(samples).items()}
    second = {s.prompt_id: s.tokens for s in samples if s.repetition == 1}
    assert agreement(second, first) == 1.0  # greedy decoding repeats itself exactly
    assert (tmp_path / "server.log").read_text().count("processing task") == 1 + 4  # warm-up, then measured


class ScriptedServer:
    """Answers /completion with rates from a script (a unit stand-in for LlamaServer.complete)."""

    def __init__(self, rates):
        self.rates = iter(rates)

    def complete(self, prompt, n_predict, temperature, seed):
        from tuner.measurement.server_process import Completion

        rate = next(self.rates)
        return Completion(
            text="t",
            tokens=(1,),
            predicted_n=n_predict,
            predicted_ms=1000.0 * n_predict / rate,
            predicted_per_second=rate,
            prompt_n=1,
            prompt_ms=1.0,
            draft_n=0,
            draft_n_accepted=0,
            stop_type="limit",
        )


@pytest.mark.parametrize(
    "rates, passes",
    [
        ([100.0] * 5, 2),  # warm-up and two steady passes: no third
        (
            [100.0] * 3 + [50.0] * 2 + [100.0] * 4,
            4,
        ),  # noisy: passes go on to max_repetitions, the hook up to its last
    ],
)
def test_the_hook_says_no_request_follows_the_last(rates, passes):
    workload = Workload(prompts=(Prompt("a", "code", "x"), Prompt("b", "code", "y")))
    settings = MeasurementSettings(warmup=1, repetitions=2, max_repetitions=4, n_predict=10, noise_cv=0.05)
    hooked = []
    samples = run_workload(
        ScriptedServer(rates),
        workload,
        settings,
        0.0,
        after_request=lambda so_far, done, more: hooked.append((len(so_far), done, more)),
    )
    assert {s.repetition for s in samples} == set(range(passes))
    assert [n for n, _, more in hooked if more] == list(range(1, 2 * passes))  # every request but the last
    assert [n for n, done, _ in hooked if done] == [2 * p for p in range(1, passes + 1)]


def test_per_source_counts_are_differences_of_the_servers_running_totals():
    from tuner.measurement.measure import per_source, with_sources
    from tuner.measurement.server_process import source_blocks

    log = "\n".join(
        [
            "spec stats: statistics     ngram-simple: #calls(b,g,a) = 1 4 2, #gen drafts = 2, #acc drafts = 1, "
            "#gen tokens = 6, #acc tokens = 3",
            "spec stats: statistics     draft-simple: #calls(b,g,a) = 1 3 3, #gen drafts = 3, #acc drafts = 3, "
            "#gen tokens = 12, #acc tokens = 5",  # the warm-up request
            "slot print_timings: eval time = ...",
            "spec stats: statistics     ngram-simple: #calls(b,g,a) = 2 9 5, #gen drafts = 5, #acc drafts = 4, "
            "#gen tokens = 16, #acc tokens = 11, #mean acc len = 3.20, #acc rate/pos = (0.8, 0.6)",
            "spec stats: statistics     draft-simple: #calls(b,g,a) = 2 6 6, #gen drafts = 6, #acc drafts = 5, "
            "#gen tokens = 20, #acc tokens = 9",
        ]
    )
    blocks = source_blocks(log)
    assert blocks == [
        {"ngram-simple": (6, 3), "draft-simple": (12, 5)},
        {"ngram-simple": (16, 11), "draft-simple": (20, 9)},
    ]
    sample = Sample("p", "code", 0, 32, 100.0, 320.0, 18, 12, "", ())
    [measured] = with_sources([sample], blocks)
    assert measured.sources == (("ngram-simple", 10, 8), ("draft-simple", 8, 4))
    assert per_source([measured, measured]) == {"ngram-simple": (20, 16), "draft-simple": (16, 8)}
    assert with_sources([sample, sample, sample], blocks) == [sample] * 3  # totals missing: left unrecorded


def test_a_lookup_that_remembers_is_measured_a_launch_per_pass(synthetic_models, tmp_path):
    """ngram-mod keeps its table across a server's requests: in one server the second pass drafts answers from the
    first's, and the first prompt's from the warm-up. So each pass gets a launch of its own, warmed up on text no
    pass measures: the two passes then draft and accept exactly alike."""
    from tuner.measurement.measure import unseen
    from tuner.measurement.measured_launch import Requests, ServerLaunch, measured_launch
    from tuner.measurement.workload import load_workload

    workload = Workload(prompts=load_workload(["prose"], tmp_path).prompts[:3])
    settings = MeasurementSettings(warmup=1, repetitions=2, n_predict=48, ctx_size=1024)
    # one thread: what is asserted (drafts alike pass to pass) holds at any count, and two threads on two cores
    # beside another busy process wait on each other (355 s in a loaded `make test`, 3 s quiet)
    argv = [str(binary("llama-server")), "-m", str(synthetic_models.path("target")), "-t", "1", "-c", "1024"]
    argv += ["-np", "1", "--no-webui", "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "3"]
    argv += ["--spec-ngram-mod-n-max", "8", "--spec-ngram-mod-n-min", "1"]
    ids = [p.id for p in workload.prompts]

    def measured(remembers: bool, name: str):
        hooked = []
        launched = measured_launch(
            ServerLaunch(argv, tmp_path / f"{name}.log", timeout_s=120),
            requests=Requests(
                workload,
                settings,
                0.0,
                remembers=remembers,
                after_request=lambda so_far, done, more: hooked.append((len(so_far), done, more)),
            ),
        )
        accepted = {(s.prompt_id, s.repetition): s.draft_n_accepted for s in launched.samples}
        return launched, accepted, hooked

    fresh, fresh_accepted, hooked = measured(True, "fresh")
    assert [(s.prompt_id, s.repetition) for s in fresh.samples] == [(p, r) for r in (0, 1) for p in ids]
    assert [(n, done) for n, done, _ in hooked] == [(n, n % 3 == 0) for n in range(1, 7)]
    assert [more for *_, more in hooked] == [True] * 5 + [
        False
    ]  # after the first pass: another launch follows
    assert (tmp_path / "fresh.log").exists() and (tmp_path / "fresh-pass2.log").exists()
    for pid in ids:  # a fresh table each pass: the same drafts, the same answer
        assert fresh_accepted[(pid, 0)] == fresh_accepted[(pid, 1)]
    assert [s.tokens for s in fresh.samples[:3]] == [s.tokens for s in fresh.samples[3:]]
    _, one_accepted, _ = measured(False, "one-server")
    assert not (tmp_path / "one-server-pass2.log").exists()
    # one server remembers: its second pass accepts more, and the first prompt (the warm-up's) already does
    assert sum(one_accepted[(p, 1)] for p in ids) > sum(one_accepted[(p, 0)] for p in ids)
    assert one_accepted[(ids[0], 0)] > fresh_accepted[(ids[0], 0)]
    assert unseen(Prompt("x", "prose", "The keeper climbed")).text == "climbed keeper The"
