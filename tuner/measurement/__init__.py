"""One trial's measurement: the argv builder and pinning (``launch``), the llama-server process (``server_process``), one
measured launch with its host checks, the one owner of a server's launch (``measured_launch``), prompt suites
(``workload``), a workload pass and its scores (``measure``), output quality (``quality``) and the failure taxonomy
(``failures``).
"""
