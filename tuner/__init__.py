"""llama-tuner: Optuna studies over llama.cpp launch configurations on CPU servers."""

__version__ = "0.1.0"
