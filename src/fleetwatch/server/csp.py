"""Security headers of the server's HTML: the fleet page and the weekly report.

Each Content-Security-Policy allows exactly what its page needs: no script anywhere, nothing may
frame either page. The fleet page has one inline style block and posts its sign-in form to
itself; the weekly report embeds its plots as ``data:`` PNGs and its style block is allowed by its
SHA-256, so an injected ``<style>`` or ``style=`` would not apply.
"""

from __future__ import annotations

import base64
import hashlib
import re

__all__ = ["PAGE_HEADERS", "report_headers"]

_COMMON = {
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}

PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    **_COMMON,
}

_STYLE_BLOCK = re.compile(r"<style[^>]*>(.*?)</style>", re.DOTALL | re.IGNORECASE)


def report_headers(html: str) -> dict[str, str]:
    """Headers for the weekly report's HTML: its own style blocks by hash, images from data:."""
    hashes = sorted(
        {
            "'sha256-" + base64.b64encode(hashlib.sha256(block.encode()).digest()).decode() + "'"
            for block in _STYLE_BLOCK.findall(html)
        }
    )
    style = " ".join(hashes) or "'none'"
    policy = (
        f"default-src 'none'; img-src data:; style-src {style}; form-action 'none'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )
    return {"Content-Security-Policy": policy, **_COMMON}
