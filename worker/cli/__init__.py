"""The `contextlog` command line."""
