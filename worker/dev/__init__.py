"""Developer tooling: embedded servers, `make run`, the demo and the terminal chat."""
