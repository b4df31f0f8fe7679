"""The bench's subcommands (``python -m benchmarks COMMAND``): each parses its flags and calls one benchmark."""
