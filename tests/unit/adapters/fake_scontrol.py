#!/usr/bin/env python3
"""A fake ``scontrol`` for unit tests: nodes in a JSON file, every argv appended to a log.

Environment: ``FAKE_SCONTROL_STATE`` (JSON: {node: {"state": ..., "reason": ..., "fail": msg}})
and ``FAKE_SCONTROL_LOG`` (one JSON argv list a line). Understands only what the adapter runs:
``--oneliner show node [NAME]`` and ``update NodeName=N State=DRAIN|RESUME [Reason=R]``.
"""

import json
import os
import sys

state_path = os.environ["FAKE_SCONTROL_STATE"]
with open(os.environ["FAKE_SCONTROL_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
with open(state_path) as fh:
    nodes = json.load(fh)
args = [a for a in sys.argv[1:] if a not in ("--oneliner", "-o")]


def line(name, node):
    text = f"NodeName={name} Arch=x86_64 CoresPerSocket=1 State={node['state']} Partitions=gpu"
    if node.get("reason"):
        text += f" Reason={node['reason']} [root@2026-11-30T08:00:00]"
    return text


if args[:2] == ["show", "node"]:
    names = args[2:] or sorted(nodes)
    for name in names:
        if name not in nodes:
            sys.stderr.write(f"Node {name} not found" + "\n")
            sys.exit(1)
        sys.stdout.write(line(name, nodes[name]) + "\n")
    sys.exit(0)
if args and args[0] == "update":
    fields = dict(a.split("=", 1) for a in args[1:])
    node = nodes.get(fields["NodeName"])
    if node is None:
        sys.stderr.write("slurm_update error: Invalid node name specified" + "\n")
        sys.exit(1)
    if node.get("fail"):
        sys.stderr.write(node["fail"] + "\n")
        sys.exit(1)
    base = node["state"].split("+")[0]
    if fields["State"] == "DRAIN":
        node.update(state=f"{base}+DRAIN", reason=fields["Reason"])
    elif fields["State"] == "RESUME":
        node.update(state=base, reason="")
    with open(state_path, "w") as fh:
        json.dump(nodes, fh)
    sys.exit(0)
sys.stderr.write(f"fake scontrol: unsupported {sys.argv[1:]}" + "\n")
sys.exit(2)
