"""Memory bandwidth by threads: the curve, its probe, and where doctor, `tuner run --check` and the report
show where it saturates."""

from __future__ import annotations

import json
from pathlib import Path

import browser
import pandas as pd
import pytest
from fake_llama_server import write_study
from plotly.offline import get_plotlyjs

from benchmarks.replay import replay_record
from tuner.cli import main
from tuner.machine import bandwidth as bandwidths
from tuner.machine.bandwidth import BandwidthCurve, bandwidth_saturation, curve_of, probe_counts
from tuner.machine.fingerprint import COMPARABILITY_KEYS
from tuner.output.report_figures import threads_caption, threads_figure
from tuner.search.prior import same_machine
from tuner.storage.records import changes

GB = 1e9
# a server's shape: the copy bandwidth rises with threads, then flattens (and dips a little at all cores)
RISING = BandwidthCurve(
    {1: 8 * GB, 2: 15 * GB, 4: 27 * GB, 8: 36 * GB, 12: 39 * GB, 16: 41.2 * GB, 24: 40 * GB}
)
RISING_TEXT = (
    "memory bandwidth: 90% of its peak (41.2 GB/s) from 12 threads "
    "(copy probe at 1, 2, 4, 8, 12, 16, 24 threads)"
)
SYSFS = Path(__file__).parent / "data" / "sysfs"


# ---------------------------------------------------------------- the curve


def test_saturation_is_the_fewest_threads_reaching_the_share_of_the_peak():
    assert RISING.peak == 41.2 * GB and RISING.all_cores == 40 * GB
    assert RISING.saturation() == 12  # 39 >= 0.9 * 41.2; 36 is not
    assert RISING.saturation(0.8) == 8 and RISING.saturation(1.0) == 16 and RISING.saturation(0.1) == 1
    assert RISING.text() == RISING_TEXT
    assert RISING.shares()[16] == 1.0 and RISING.shares()[1] == pytest.approx(8 / 41.2)


def test_a_flat_curve_saturates_at_one_thread():
    flat = BandwidthCurve({1: 20 * GB, 2: 20 * GB, 4: 20 * GB})
    assert flat.saturation() == 1 and flat.saturation(1.0) == 1
    assert flat.text().startswith("memory bandwidth: 90% of its peak (20.0 GB/s) from 1 thread ")


def test_a_one_point_curve_says_where_it_saturates_is_not_known():
    one = BandwidthCurve({8: 30 * GB})
    assert one.saturation() == 8 and one.peak == one.all_cores == 30 * GB
    assert one.text() == (
        "memory bandwidth: 30.0 GB/s at 8 threads (copy probe at one thread count: where it saturates is not known)"
    )


def test_json_has_string_keys_and_reads_back():
    data = json.loads(json.dumps(RISING.to_json()))
    assert list(data) == ["1", "2", "4", "8", "12", "16", "24"]
    assert BandwidthCurve.from_json(data) == RISING
    shuffled = dict(reversed(list(data.items())))  # order does not matter
    assert (
        BandwidthCurve.from_json(shuffled) == RISING
        and list(BandwidthCurve.from_json(shuffled).points)[0] == 1
    )


@pytest.mark.parametrize(
    "bad",
    [
        None,
        {},
        [],
        "fast",
        [[1, 2e9]],
        {"one": 2e9},
        {"1.5": 2e9},
        {"0": 2e9},
        {"-2": 2e9},
        {"1": -2e9},
        {"1": 0},
        {"1": None},
        {"1": "x"},
        {"1": True},
        {"1": float("nan")},
        {"1": float("inf")},
        {"1": 2e9, "01": 3e9},  # two keys for one count
        {"1": 2e9, "2": {"bytes": 3e9}},
    ],
)
def test_bad_json_is_no_curve(bad):
    assert BandwidthCurve.from_json(bad) is None


def test_an_empty_or_negative_curve_is_refused():
    for points in ({}, {0: GB}, {1: -GB}):
        with pytest.raises(ValueError):
            BandwidthCurve(points)


def test_readers_take_the_saturation_from_a_fingerprint():
    assert bandwidth_saturation({"bandwidth_by_threads": RISING.to_json()}) == 12
    assert curve_of({"bandwidth_by_threads": RISING.to_json()}) == RISING
    for fp in ({}, {"bandwidth_by_threads": None}, {"bandwidth_by_threads": {"1": "x"}}):
        assert bandwidth_saturation(fp) is None and curve_of(fp) is None


@pytest.mark.parametrize(
    ("cores", "ladder"),
    [
        (1, (1,)),
        (2, (1, 2)),
        (6, (1, 2, 4, 6)),
        (16, (1, 2, 4, 8, 12, 16)),
        (64, (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)),
        (96, (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)),
        (100, (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 100)),
    ],
)
def test_the_ladder_is_geometric_from_one_thread_to_all_cores(cores, ladder):
    assert probe_counts(cores) == ladder


def test_the_probe_measures_every_count_of_the_ladder():
    curve = bandwidths.probe_bandwidth_curve(2, seconds=0.5)
    assert sorted(curve.points) == [1, 2]
    assert all(v > 0 for v in curve.points.values())
    assert 1 <= curve.saturation() <= 2


def test_a_curve_that_moved_is_no_reason_to_refuse_a_resume():
    assert "bandwidth_by_threads" not in COMPARABILITY_KEYS
    fp = {"cpu_model": "x", "physical_cores": 4, "bandwidth_bytes_per_s": 20 * GB}
    a = replay_record("s", {}, ("tokens_per_second",), {**fp, "bandwidth_by_threads": RISING.to_json()})
    b = replay_record("s", {}, ("tokens_per_second",), {**fp, "bandwidth_by_threads": None})
    assert changes(a, b) == [] and same_machine(a, b)


# ---------------------------------------------------------------- where it is shown


@pytest.fixture
def probed(monkeypatch) -> BandwidthCurve:
    """No TUNER_MEMORY_BANDWIDTH, and a probe that returns RISING at once (the probe itself is tested above)."""
    monkeypatch.delenv(bandwidths.BANDWIDTH_ENV, raising=False)
    monkeypatch.setattr(bandwidths, "probe_bandwidth_curve", lambda cores: RISING)
    return RISING


def test_doctor_prints_the_curve_on_the_live_machine(probed, capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert RISING_TEXT in out
    assert "  at all 24 cores: 40.0 GB/s (STREAM-counted read + write; the roofline's bandwidth)" in out
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["fingerprint"]["bandwidth_by_threads"] == RISING.to_json()


def test_doctor_without_a_probe(probed, monkeypatch, capsys):
    assert main(["doctor", "--no-bandwidth"]) == 0
    assert "memory bandwidth" not in capsys.readouterr().out
    assert main(["doctor", "--sysfs-root", str(SYSFS / "one-node-2core")]) == 0  # another machine's tree
    assert "memory bandwidth" not in capsys.readouterr().out
    monkeypatch.setenv(bandwidths.BANDWIDTH_ENV, "20e9")
    assert main(["doctor"]) == 0
    assert (
        "memory bandwidth: 20.0 GB/s (given in TUNER_MEMORY_BANDWIDTH, not probed)" in capsys.readouterr().out
    )


def test_check_prints_the_curve_under_the_machine(probed, tmp_path, env, capsys):
    path = write_study(tmp_path, f"sqlite:///{tmp_path / 'studies.db'}")
    assert main(["run", str(path), "--check"]) == 0
    out = capsys.readouterr().out.splitlines()
    machine = next(i for i, line in enumerate(out) if line.startswith("  machine  "))
    assert "40.0 GB/s memory bandwidth (copy probe)" in out[machine]  # the curve's figure at all cores
    assert out[machine + 1] == f"  {RISING_TEXT}"
    assert out[machine + 2].startswith("  search   threads")  # the walk the search will take (walk_text)


def test_check_without_a_curve_prints_no_curve_line(tmp_path, env, capsys):
    path = write_study(tmp_path, f"sqlite:///{tmp_path / 'studies.db'}")  # conftest gives a figure: no probe
    assert main(["run", str(path), "--check"]) == 0
    assert "memory bandwidth: " not in capsys.readouterr().out


def test_the_report_draws_the_curve_beside_the_threads():
    frame = pd.DataFrame(
        {"numa": ["none", "none"], "threads": [1, 2], "best_tokens_per_second": [10.0, 17.0]}
    )
    page = threads_figure(frame, RISING, "fig-threads-numa")
    assert "memory bandwidth (share of peak)" in page and '"yaxis":"y2"' in page.replace(" ", "")
    assert "memory bandwidth (share of peak)" not in threads_figure(frame, None, "fig-threads-numa")
    caption = threads_caption(RISING)
    assert "memory bandwidth saturates (90% of its peak, 41.2 GB/s) from 12 threads" in caption
    assert "no memory bandwidth by threads" in threads_caption(None)


def test_the_curve_is_drawn_on_the_threads_plot_in_headless_chromium(tmp_path):
    frame = pd.DataFrame(
        {"numa": ["none", "none"], "threads": [1, 2], "best_tokens_per_second": [10.0, 17.0]}
    )
    page = tmp_path / "threads.html"
    page.write_text(
        f"<html><head><script>{get_plotlyjs()}</script></head><body>"
        f"{threads_figure(frame, RISING, 'fig-threads-numa')}</body></html>"
    )
    figure = browser.render(page.as_uri(), screenshot="threads-bandwidth.png").by_id("fig-threads-numa")
    assert len(figure.find_all("g", "trace")) == 2  # the NUMA policy's line and the bandwidth's
    legend = {e.all_text().strip() for e in figure.find_all("g", "traces")}
    assert {"none", "memory bandwidth (share of peak)"} <= legend
    assert len(figure.find_all("path", "point")) == 2 + len(RISING.points)


def test_check_shows_the_ladder_a_96_thread_space_walks():
    from tuner.search.stages.hardware import walk_text

    text = walk_text(list(range(1, 97)), 96, 32, 4)
    assert text.startswith(
        "threads 1..96: the policies at 32 threads (the bandwidth probe), then the ladder "
    )
    assert "96, 32, 72, 48, 24 on the best policy" in text and "halved down to 6 thread(s)" in text
    assert "bind within one node's 24 cores" in text
    assert walk_text(list(range(1, 17)), 16, None, 1).startswith("threads 1..16: the ladder 16, 12, 8, 4 ")
