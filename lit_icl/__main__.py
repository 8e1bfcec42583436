"""``python -m lit_icl``: see :mod:`lit_icl.cli`."""

import sys

try:
    from lit_icl.cli import main
except KeyboardInterrupt:  # Ctrl-C while torch and Lightning import (a few seconds): one line, not a traceback
    print("lit_icl: interrupted by Ctrl-C before the run started", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    main()
