"""The ground floor: the knob registry (``registry``) and the configuration every stage speaks
(``config``: ``TrialConfig``, knob domains, ``method_of``). Imports nothing above it."""
