"""The study file: YAML read with errors that name file and field (``validate``), parsed into a ``StudySpec`` (``spec``)."""
