"""PCI addresses as the kernel and NVIDIA's tools print them, in the wire's canonical form.

The kernel prints ``0000:3b:00.0`` (Xid lines drop the function: ``0000:3b:00``), nvidia-smi and
the Fabric Manager ``00000000:3B:00.0``, old AER lines a 16-bit requester id (``id=00e5``: bus
``00``, device ``1c``, function ``5``). All become ``dddd:bb:dd.f``, lower case, so that an address
read from the kernel log can be compared with a GPU's ``pci_bus_id``.
"""

from __future__ import annotations

from fleetwatch.agent.parsers import ParseError
from fleetwatch.telemetry import normalize_pci_bus_id

__all__ = ["PCI_PATTERN", "pci_address", "requester_id_address"]

# Domain (4 to 8 hex digits in practice), bus, device and an optional function.
PCI_PATTERN = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?"


def pci_address(value: str) -> str:
    """``value`` in canonical form; a missing function is function 0 (a GPU is function 0)."""
    if "." not in value:
        value += ".0"
    try:
        return normalize_pci_bus_id(value)
    except ValueError as exc:
        raise ParseError(str(exc)) from exc


def requester_id_address(requester_id: str, *, domain_of: str) -> str:
    """The address an AER requester id names, in the PCI domain of ``domain_of``.

    The id is ``bus << 8 | device << 3 | function`` (PCIe base spec, Requester ID); the kernel
    prints it as four hex digits (``id=0010`` is bus 00, device 02, function 0).

    >>> requester_id_address("00e5", domain_of="0000:00:1c.5")
    '0000:00:1c.5'
    """
    number = int(requester_id, 16)
    domain = pci_address(domain_of).split(":", 1)[0]
    return f"{domain}:{number >> 8:02x}:{(number >> 3) & 0x1F:02x}.{number & 0x7}"
