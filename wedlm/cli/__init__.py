"""The `wedlm` command line: thin wrappers that parse arguments and call the library."""
