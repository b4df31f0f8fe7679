"""Storage: the typed records (``records``), the one reader and writer of Optuna's storage (``store``), the journal
and outage retries that keep a measurement through a storage failure, worker coordination, redacted URLs.
"""
