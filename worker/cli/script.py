"""The `contextlog` console script: the plain install (what an adapter needs) lacks the
worker's dependencies, so this names the extra to install, in one line, before the CLI
that imports them is loaded."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final

from contextlog.worker.cli.extras import extra_for, install_hint

EXIT_ERROR: Final = 2  # the CLI's code for bad configuration (cli.common.EXIT_ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI, or say in one line which extra it needs."""
    try:
        # Imported here, not at the top: importing it is what needs the extra.
        from contextlog.worker.cli.main import main as cli_main
    except ModuleNotFoundError as e:
        extra = extra_for(e)
        if extra is None:
            raise
        print(f"contextlog: {install_hint(extra, e.name)}", file=sys.stderr)
        return EXIT_ERROR
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
