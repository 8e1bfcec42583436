"""``python -m lit_icl``: see :mod:`lit_icl.cli`."""

from lit_icl.cli import main

if __name__ == "__main__":
    main()
