import sys

from .cli import main

if __name__ == "__main__":  # only when run, never on import
    sys.exit(main())
