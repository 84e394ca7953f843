"""``python -m sklearn_fedmf.flower``: a site's SuperNode with a warm ClientApp process."""

from ._supernode import main

if __name__ == "__main__":
    main()
