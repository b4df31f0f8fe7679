"""The ``tuner`` subcommands: each module parses its flags and calls the domain; argparse lives only here and in cli.py."""
