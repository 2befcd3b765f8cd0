"""`python -m fp8kit ARGS...`: the fp8kit command-line tool, run in this process by the same compiled code as the
`fp8kit` binary (the CLI's commands are linked into the extension). Output, errors and exit status are the tool's."""
import sys

from . import _fp8kit


def main() -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    return _fp8kit.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
