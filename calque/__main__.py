"""`python -m calque ...`: the same CLI as the `calque` console script."""

from calque.cli.main import main

raise SystemExit(main())
