"""``python -m sklearn_fedmf.cli`` runs the ``fedmf`` command, as ``python -m sklearn_fedmf``."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
