"""MkDocs hook: the REST API reference page, rendered from the app's own OpenAPI document.

The page is Markdown written at build time from ``create_app(...).openapi()``, so it cannot
drift from the routes, and it needs no script at all: a Swagger UI or ReDoc page would load its
JavaScript, and on a docs site that is usually from a CDN. The app itself serves the interactive
pages offline at ``/docs`` and ``/redoc``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "rest-api-reference.md"
METHODS = ("get", "put", "post", "patch", "delete", "head", "options")
# Code spans pass through untouched; outside them `<` and `|` would start HTML or a table cell.
_CODE = re.compile(r"(`+)(.+?)\1", re.DOTALL)


def app_openapi() -> dict[str, Any]:
    """The OpenAPI document of an app on an in-memory database (nothing is opened to build it)."""
    from fleetwatch.config import ServerSettings
    from fleetwatch.server.app import create_app

    settings = ServerSettings(database_url="sqlite://", _env_file=None)
    return create_app(settings).openapi()


def text(value: str, *, cell: bool = False) -> str:
    """Description text as Markdown, on one line when it goes in a table ``cell``."""
    out = []
    last = 0
    for match in _CODE.finditer(value):
        out.append(_escape(value[last : match.start()], cell))
        out.append(match.group(0).replace("\n", " ") if cell else match.group(0))
        last = match.end()
    out.append(_escape(value[last:], cell))
    joined = "".join(out)
    return " ".join(joined.split()) if cell else joined.strip()


def _escape(plain: str, cell: bool) -> str:
    plain = plain.replace("<", "&lt;").replace(">", "&gt;")
    return plain.replace("|", "\\|") if cell else plain


def schema_anchor(name: str) -> str:
    return "schema-" + re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def type_of(schema: dict[str, Any]) -> str:
    """A schema as a short phrase: ``integer``, ``array of [Gpu](#schema-gpu)``, ``one of ...``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{schema_anchor(name)})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_unique(type_of(s) for s in schema[key]))
    if "allOf" in schema:
        return " and ".join(_unique(type_of(s) for s in schema["allOf"]))
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        items = schema.get("items")
        return f"array of {type_of(items)}" if items else "array"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'])}"
    if kind is None:
        return "any"
    return f"{kind} ({schema['format']})" if "format" in schema else str(kind)


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def limits(schema: dict[str, Any]) -> str:
    """Constraints and default, e.g. ``≥ 1, ≤ 100; default `10```."""
    parts = []
    for key, sign in (
        ("minimum", "≥"),
        ("exclusiveMinimum", ">"),
        ("maximum", "≤"),
        ("exclusiveMaximum", "<"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
    ):
        if key in schema:
            parts.append(f"{sign} {schema[key]}")
    if "pattern" in schema:
        parts.append(f"pattern `{schema['pattern']}`")
    if "default" in schema:
        parts.append(f"default `{json.dumps(schema['default'])}`")
    return ", ".join(parts)


def _row(*cells: str) -> str:
    return "| " + " | ".join(cell or " " for cell in cells) + " |"


def _described(description: str, schema: dict[str, Any]) -> str:
    return "; ".join(part for part in (text(description, cell=True), limits(schema)) if part)


def operation(method: str, path: str, op: dict[str, Any]) -> Iterator[str]:
    yield f"### `{method.upper()} {path}`"
    yield ""
    if op.get("summary"):
        yield f"**{text(op['summary'])}**"
        yield ""
    if op.get("description"):
        yield text(op["description"])
        yield ""
    yield "Authentication: " + ("bearer token." if op.get("security") else "none.")
    yield ""
    parameters = op.get("parameters", [])
    if parameters:
        yield _row("parameter", "in", "type", "required", "description")
        yield "|---|---|---|---|---|"
        for p in parameters:
            schema = p.get("schema", {})
            description = p.get("description") or schema.get("description", "")
            yield _row(
                f"`{p['name']}`",
                p["in"],
                type_of(schema),
                "yes" if p.get("required") else "no",
                _described(description, schema),
            )
        yield ""
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            required = "required" if body.get("required") else "optional"
            yield f"Request body ({required}), `{media}`: {type_of(content.get('schema', {}))}"
            yield ""
    yield _row("status", "meaning", "body")
    yield "|---|---|---|"
    for status, response in sorted(op.get("responses", {}).items(), key=lambda kv: kv[0]):
        bodies = [
            f"`{media}` {type_of(content['schema'])}" if content.get("schema") else f"`{media}`"
            for media, content in response.get("content", {}).items()
        ]
        yield _row(status, text(response.get("description", ""), cell=True), "<br>".join(bodies))
    yield ""


def schema_section(name: str, schema: dict[str, Any]) -> Iterator[str]:
    yield f"### {name} {{ #{schema_anchor(name)} }}"
    yield ""
    if schema.get("description"):
        yield text(schema["description"])
        yield ""
    properties = schema.get("properties", {})
    if not properties:
        yield f"Type: {type_of(schema)}"
        yield ""
        return
    required = set(schema.get("required", []))
    yield _row("field", "type", "required", "description")
    yield "|---|---|---|---|"
    for field, prop in properties.items():
        yield _row(
            f"`{field}`",
            type_of(prop),
            "yes" if field in required else "no",
            _described(prop.get("description", ""), prop),
        )
    yield ""


def render(spec: dict[str, Any]) -> str:
    """The whole page for an OpenAPI 3 document."""
    info = spec.get("info", {})
    lines = [
        "# REST API reference",
        "",
        f"<!-- Generated at build time from the app's OpenAPI document (version "
        f"{info.get('version', '?')}) by scripts/mkdocs/rest_api_reference.py. -->",
        "",
        text(info.get("description", "")),
        "",
        "Generated from the OpenAPI document the server serves at `/openapi.json`; "
        "[REST API](rest-api.md) is the overview. Every operation, grouped by tag, then every "
        "schema the operations name.",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in spec.get("paths", {}).items():
        for method in METHODS:
            if method in item:
                op = item[method]
                by_tag.setdefault((op.get("tags") or ["other"])[0], []).append((method, path, op))
    for tag, operations in by_tag.items():
        lines += [f"## {tag}", ""]
        for method, path, op in operations:
            lines += operation(method, path, op)
    schemas = spec.get("components", {}).get("schemas", {})
    if schemas:
        lines += ["## Schemas", ""]
        for name in sorted(schemas):
            lines += schema_section(name, schemas[name])
    return "\n".join(lines).rstrip() + "\n"


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, PAGE, content=render(app_openapi())))
    return files
