"""The repository's Dockerfile, read for tests: its build arguments and what its final stage
declares (user, working directory, ports, health check, entrypoint and command), in the shape
``podman image inspect`` reports them, so that a test can hold a built image against it."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "Dockerfile"

_DURATION = re.compile(r"^(\d+)(ms|s|m|h)$")
_EXEC_FORM = {"ENTRYPOINT": "Entrypoint", "CMD": "Cmd"}  # podman's names
_NANOSECONDS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}


@dataclass(frozen=True)
class Dockerfile:
    args: dict[str, str]  # ARG defaults, every stage's (later ones win)
    config: dict[str, Any]  # the final stage's, as podman image inspect's "Config" names it

    @property
    def debian_suite(self) -> str:
        """The suite of the default base, ``debian:<suite>-slim``."""
        found = re.fullmatch(
            r"(?:docker\.io/)?(?:library/)?debian:([a-z]+)-slim", self.args["BASE"]
        )
        assert found, f"BASE is not debian:<suite>-slim: {self.args['BASE']}"
        return found.group(1)


def _instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, rest) per instruction, continuation lines joined, comments dropped."""
    joined: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        joined.append(pending + line)
        pending = ""
    return [(i.split(None, 1)[0].upper(), i.split(None, 1)[1].strip()) for i in joined]


def _nanoseconds(duration: str) -> int:
    found = _DURATION.fullmatch(duration)
    assert found, f"unread duration {duration!r}"
    return int(found.group(1)) * _NANOSECONDS[found.group(2)]


def read_dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    args: dict[str, str] = {}
    config: dict[str, Any] = {}
    for keyword, rest in _instructions(path.read_text()):
        if keyword == "ARG" and "=" in rest:
            name, value = rest.split("=", 1)
            args[name] = shlex.split(value)[0] if value else ""
        elif keyword == "FROM":
            config = {}
        elif keyword == "USER":
            config["User"] = rest
        elif keyword == "WORKDIR":
            config["WorkingDir"] = rest
        elif keyword == "EXPOSE":
            config["ExposedPorts"] = {p if "/" in p else f"{p}/tcp": {} for p in rest.split()}
        elif keyword in _EXEC_FORM:
            config[_EXEC_FORM[keyword]] = json.loads(rest)
        elif keyword == "HEALTHCHECK":
            words = rest.split()
            options = {}
            while words[0].startswith("--"):
                name, value = words.pop(0)[2:].split("=", 1)
                options[name.title()] = _nanoseconds(value)
            assert words[0] == "CMD", rest
            command = rest.split(None, len(options) + 1)[-1]
            # The exec form (a JSON list) as the image records it, else the shell form.
            test = (
                ["CMD", *json.loads(command)] if command.startswith("[") else ["CMD-SHELL", command]
            )
            config["Healthcheck"] = {"Test": test, **options}
    return Dockerfile(args, config)
