"""Print the requirements of the fleetwatch package and the extras named, one a line; or, with
``--build``, what building its wheel requires.

The Dockerfile installs them in layers of their own, before it copies the source: those layers
are rebuilt only when pyproject.toml changes, not with every change to the source. Standard
library only: it runs on the image's bare python3.

    python3 requirements.py pyproject.toml server,models,agent,k8s,sim
    python3 requirements.py pyproject.toml --build
"""

import sys
import tomllib

path, names = sys.argv[1], sys.argv[2]
with open(path, "rb") as file:
    pyproject = tomllib.load(file)
if names == "--build":
    sys.stdout.write("".join(f"{r}\n" for r in pyproject["build-system"]["requires"]))
    sys.exit(0)
project = pyproject["project"]
extras = project["optional-dependencies"]
unknown = sorted(set(names.split(",")) - set(extras))
if unknown:
    sys.exit(f"{path} has no extra {', '.join(unknown)} (it has {', '.join(sorted(extras))})")
wanted = list(project["dependencies"])
for name in names.split(","):
    wanted += [r for r in extras[name] if r not in wanted]
sys.stdout.write("".join(f"{requirement}\n" for requirement in wanted))
