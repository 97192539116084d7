"""One module per subcommand: click options in, library calls, rendered results out."""
