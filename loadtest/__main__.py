"""`python -m loadtest`: hand the command line to the CLI."""

from loadtest.cli import main

raise SystemExit(main())
