"""Print the project's runtime dependencies, one per line, from pyproject.toml (image builds).

    python docker/project-deps.py pyproject.toml [EXTRA ...] [--flwr SPEC]

The image builds install these in a layer of their own, keyed on pyproject.toml alone, so a
change of the sources reinstalls only the project (``pip install --no-deps``), not scipy,
FastAPI and the rest. ``--flwr SPEC`` replaces the flwr requirement (the Flower images keep the
base image's flwr and need no Ray: ``flwr==1.41.0`` instead of ``flwr[simulation]``). torch is
left out: the builds install it first, from its own index (docker/pip-install.sh).
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", help="path of pyproject.toml")
    parser.add_argument("extras", nargs="*", help="optional-dependency groups to add")
    parser.add_argument("--flwr", help="the flwr requirement to print instead of the project's")
    args = parser.parse_args(argv)
    with open(args.pyproject, "rb") as fh:
        project = tomllib.load(fh)["project"]
    wanted = list(project["dependencies"])
    for extra in args.extras:
        wanted += project["optional-dependencies"][extra]
    for requirement in wanted:
        name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()
        if name == "torch":
            continue
        if name == "flwr" and args.flwr is not None:
            requirement = args.flwr
        print(requirement)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
