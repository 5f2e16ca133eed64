"""``python -m accord.kvstore.server``: run one parameter-server process."""
import sys

from accord.kvstore.server.program import main

if __name__ == "__main__":
    sys.exit(main())
