"""`python -m xgrad_llm`: the `xgrad-llm` command."""

from xgrad_llm.cli import main

raise SystemExit(main())
