"""Analysis and output: records as frames (``analysis``), the HTML report (``report``; its page ``report_html``, figures
``report_figures``, tables ``report_tables``, HTML primitives ``report_markup``), conversations
turn by turn (``turns``), the export of the winner (``export``), two studies compared (``compare``), optuna-dashboard
(``dashboard``), ``tuner doctor`` (``doctor``), files written whole (``files``).
"""
