"""Analysis and output: records as frames (``analysis``), the HTML report (``report``, ``report_html``), the export of
the winner (``export``), two studies compared (``compare``), optuna-dashboard (``dashboard``).
"""
