"""`python -m hookscope`: the `hookscope` command."""

from hookscope.cli import main

raise SystemExit(main())
