"""Print the requirements of the fleetwatch package and the extras named, one a line.

The Dockerfile installs them in a layer of their own, before the fleetwatch wheel: that layer is
rebuilt only when pyproject.toml changes, not with every change to the source. Standard library
only: it runs on the image's bare python3.

    python3 requirements.py pyproject.toml server,sim,models
"""

import sys
import tomllib

path, names = sys.argv[1], sys.argv[2]
with open(path, "rb") as file:
    project = tomllib.load(file)["project"]
extras = project["optional-dependencies"]
unknown = sorted(set(names.split(",")) - set(extras))
if unknown:
    sys.exit(f"{path} has no extra {', '.join(unknown)} (it has {', '.join(sorted(extras))})")
wanted = list(project["dependencies"])
for name in names.split(","):
    wanted += [r for r in extras[name] if r not in wanted]
sys.stdout.write("".join(f"{requirement}\n" for requirement in wanted))
