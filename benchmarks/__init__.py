"""Benchmarks of the tuner itself, one module per question.

* ``grid`` (`python -m benchmarks record-grid`): measure every configuration of a small space once,
  so search strategies can be compared on a real landscape without re-measuring.
* ``replay`` (`python -m benchmarks bench-search`): replay such a table and count how many trials each
  sampler needs to come within a few percent of the best feasible configuration.
* ``overhead``: the tuner's figure and wall time for a trial against llama-bench's.
* ``repeat``: two studies with different seeds, their winners re-measured side by side.
* ``gguf_read``: reading GGUF metadata, the tuner's cold and cached reads against
  gguf's full parse (the optional Gemma 3 270M package gives a real 262k-token vocabulary).
* ``session`` (`python -m benchmarks bench`): all four in one session, JSON and markdown under reports/bench/.
"""
