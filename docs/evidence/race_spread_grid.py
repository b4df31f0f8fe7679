"""The spread test against the larger spread (docs/decisions.md#a-pairs-own-spread-when-shown-wider) on cells of
`make bench` 1c's grid (four finalists and the baseline, ``race_bench.field_of``), both rules on the same draws.
Run: ``.venv/bin/python docs/evidence/race_spread_grid.py . 400 0.05:0.05:0,0.05:0.05:0.03`` (launch:round:gap)."""

import json
import random
import statistics
import sys

sys.path.insert(0, sys.argv[1])
from benchmarks import race_bench as rb
from tuner.studyfile.spec import RaceSpec

spec = RaceSpec()
cells = [tuple(map(float, c.split(":"))) for c in sys.argv[3].split(",")]
runs = int(sys.argv[2])
for i, (ls, rs, g) in enumerate(cells):
    rng = random.Random(1000 + i)
    mus, res = rb.field_of(g)
    new, before = [], []
    for _ in range(runs):
        draws = rb.host_draws(mus, ls, rs, rng, spec.max_rounds)
        new.append(rb.new_race(mus, res, ls, rs, rng, spec, rb.Host(draws)))
        before.append(rb.new_race(mus, res, ls, rs, rng, spec, rb.Host(draws, larger_spread=True)))
    out = {"cell": [ls, rs, g]}
    for name, races in (("new", new), ("before", before)):
        s = rb.side(races, mus)
        capped = [r.loss for r in races if r.capped]
        out[name] = dict(
            holds=s.holds,
            median=s.median_loss_bound,
            cap_median=statistics.median(capped) if capped else None,
            capped=len(capped),
            wrong=s.wrong,
            wd=f"{s.wrong_decided}/{s.decided}",
            launches=s.launches,
            coverage=s.coverage,
        )
    print(json.dumps(out), flush=True)
