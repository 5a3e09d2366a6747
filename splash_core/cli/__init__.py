"""The ``splash`` command line: one module per subcommand, each with ``--json``."""
