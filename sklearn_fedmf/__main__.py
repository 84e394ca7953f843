"""``python -m sklearn_fedmf`` runs the ``fedmf`` command (see :mod:`sklearn_fedmf.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
