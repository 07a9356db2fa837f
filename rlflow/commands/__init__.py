"""One module per `rlflow` subcommand; each has `add_parser(subparsers)` and `run(args) -> int`."""
