"""``fleetwatch parse``: what FleetWatch makes of a node's output, one JSON object per line.

The operator's debugging tool, and a contract: Xid events as
``{"kind","xid","pci_bus_id","ts","message","pid","process"}``, GPU samples as the canonical
fields plus identity. Unparseable input: a message on stderr naming the line, exit code 1, the
good lines still printed.

``parse kernel`` reads every kernel-log source (Xid, lost GPUs, NVSwitch SXid, PCIe AER, machine
checks, EDAC) and prints ``{"line","kind","ts","pci_bus_id","uuid","xid","message","pid",
"process","details"}`` per event. Lines it cannot read, and lines cut short whose event was kept,
are named on stderr; the exit code is non-zero only when the input cannot be read at all.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import click

__all__ = ["parse"]


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=_json_default) + "\n")


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _read(path: Path) -> str:
    if str(path) == "-":
        return sys.stdin.read()
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc}") from exc


@click.group()
def parse() -> None:
    """Parse saved node output (a file, or - for stdin)."""


@parse.command("xid")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--year", type=int, help="Year for syslog stamps that carry none")
def parse_xid(file: Path, year: int | None) -> None:
    """Kernel log (dmesg, journal, /dev/kmsg, syslog) -> one event per Xid line."""
    from fleetwatch.agent.parsers.kernel_log import parse_kernel_log

    result = parse_kernel_log(_read(file), year_hint=year)
    for event in result.events:
        _emit(
            {
                "kind": event.kind,
                "xid": event.xid,
                "pci_bus_id": event.pci_bus_id,
                "ts": event.ts,
                "message": event.message,
                "pid": event.pid,
                "process": event.process,
            }
        )
    _fail_on(result.errors)


@parse.command("kernel")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--year", type=int, help="Year for syslog stamps that carry none")
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="PCI=UUID",
    help="A GPU of the node (repeatable): events naming its PCI address get its uuid",
)
@click.option(
    "--summary", is_flag=True, help="Count lines, events per kind and bad lines on stderr"
)
def parse_kernel(file: Path, year: int | None, gpus: tuple[str, ...], summary: bool) -> None:
    """Kernel log -> one event per Xid, lost GPU, SXid, PCIe AER, machine check or EDAC report."""
    from fleetwatch.agent.parsers.kernel_events import KernelLogReader

    index = _gpu_index(gpus)
    reader = KernelLogReader(year_hint=year)
    events, errors = reader.feed_all(_read(file).splitlines())
    for event in events:
        if event.uuid is None and event.pci_bus_id in index:
            event.uuid = index[event.pci_bus_id]
        _emit(
            {
                "line": event.line_number,
                "kind": event.kind,
                "ts": event.ts,
                "pci_bus_id": event.pci_bus_id,
                "uuid": event.uuid,
                "xid": event.xid,
                "message": event.message,
                "pid": event.pid,
                "process": event.process,
                "details": event.details,
            }
        )
        if event.details and event.details.get("incomplete"):
            click.echo(
                f"line {event.line_number}: cut short: kept the {event.kind} report "
                f"({event.details.get('count', 1)} error(s)) without its location",
                err=True,
            )
    for error in errors:
        click.echo(f"{error}", err=True)
    if summary:
        kinds = Counter(e.kind for e in events)
        counted = ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items())) or "none"
        click.echo(
            f"{reader.lines_read} lines, {len(events)} events ({counted}), "
            f"{len(errors)} unreadable lines",
            err=True,
        )


def _gpu_index(pairs: tuple[str, ...]) -> dict[str, str]:
    from fleetwatch.telemetry import normalize_pci_bus_id

    index: dict[str, str] = {}
    for pair in pairs:
        pci, sep, uuid = pair.partition("=")
        try:
            if not sep or not uuid:
                raise ValueError("expected PCI=UUID")
            index[normalize_pci_bus_id(pci)] = uuid.strip()
        except ValueError as exc:
            raise click.BadParameter(f"{pair!r}: {exc}", param_hint="--gpu") from exc
    return index


def _fail_on(errors: list[Any]) -> None:
    for error in errors:
        click.echo(f"{error}", err=True)
    if errors:
        sys.exit(1)


def _emit_readings(readings: list[Any]) -> None:
    for reading in readings:
        _emit({**reading.identity, **reading.values})


@parse.command("nvidia-smi")
@click.argument("file", type=click.Path(path_type=Path))
def parse_nvidia_smi(file: Path) -> None:
    """``nvidia-smi -q -x`` XML or ``nvidia-smi -q`` text -> one sample per GPU."""
    from fleetwatch.agent.parsers import ParseError
    from fleetwatch.agent.parsers.nvidia_smi_text import parse_nvidia_smi_text
    from fleetwatch.agent.parsers.nvidia_smi_xml import parse_nvidia_smi_xml

    text = _read(file)
    parser = parse_nvidia_smi_xml if text.lstrip().startswith("<") else parse_nvidia_smi_text
    try:
        _emit_readings(parser(text))
    except ParseError as exc:
        _fail_on([exc])


@parse.command("dcgm")
@click.argument("file", type=click.Path(path_type=Path))
def parse_dcgm(file: Path) -> None:
    """dcgm-exporter ``/metrics`` text -> one sample per GPU."""
    from fleetwatch.agent.parsers import ParseError
    from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_exporter

    try:
        _emit_readings(parse_dcgm_exporter(_read(file)))
    except ParseError as exc:
        _fail_on([exc])
