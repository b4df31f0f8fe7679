"""The study file: YAML read with errors that name file and field (``validate``), a search space as written
(``written_space``), parsed into a ``StudySpec`` (``spec``)."""
