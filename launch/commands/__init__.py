"""One module per `malloczero` command: each has `add_parser(subparsers)`, which registers the
command and its flags, and `run(args) -> exit status`."""
