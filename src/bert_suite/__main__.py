"""`python -m bert_suite ARGS` is `bert-suite ARGS`: the command for an interpreter with no scripts beside it (a
`pip install --user`, a Python whose packages are on its path), and how the product starts its own processes."""

import sys

from bert_suite_cli import main

if __name__ == "__main__":
    sys.exit(main())
