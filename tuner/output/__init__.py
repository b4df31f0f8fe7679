"""Analysis and output: records as frames (``analysis``), the HTML report (``report``, ``report_html``), conversations
turn by turn (``turns``), the export of the winner (``export``), two studies compared (``compare``), optuna-dashboard
(``dashboard``), ``tuner doctor`` (``doctor``), files written whole (``files``).
"""
