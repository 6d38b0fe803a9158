import sys

from .cli import main

if __name__ == "__main__":  # not when a worker process (spawn) imports it
    sys.exit(main())
