"""Validate Kubernetes objects against Kubernetes' own OpenAPI documents and CRD schemas.

The documents are test data (tests/deploy/data/schemas/README.md: where each comes from). The
check is strict, as ``kubectl apply --validate=strict`` and the API server's strict field
validation are: a field the schema does not name is an error (a misspelt ``imagePullPolicey``
passes a schema that merely allows extra fields), unless the schema keeps unknown fields
(``x-kubernetes-preserve-unknown-fields``). Also checked: types, required fields, enums,
int-or-string, quantities, patterns, bounds and ``anyOf``/``oneOf`` of CRD schemas. Not checked:
CEL rules (``x-kubernetes-validations``) and what only the API server's Go validation knows
(name formats, selectors matching templates...): tests/deploy/test_chart.py checks those the
chart could get wrong.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Schemas", "load_schemas"]

DATA = Path(__file__).parent / "data" / "schemas"

# SHA-256 of each document's original bytes (data/schemas/README.md). The documents repeat
# the shared schemas (ObjectMeta, LabelSelector...), at different Kubernetes versions: the
# first document to define a name wins, so core/v1, apps/v1 and batch/v1 (client-go's, the
# newest) define them, and each later document adds its own group's kinds.
_V3 = {
    "api__v1_openapi.json.gz": "6aca85ac8f0d588f75f6a74cb12481bb8dc6c325af51faa53e7e5eae3fc10719",
    "apis__apps__v1_openapi.json.gz": (
        "07b6fb5a9c92607a01c08d47d0a52ed420c7aa277cb515fb7a8459bff8cf018e"
    ),
    "apis__batch__v1_openapi.json.gz": (
        "7b9e9e38ee14590f12b9d539e5cb05d74fe11b5e15118e91f89ded18c09fc2de"
    ),
    "apis__policy__v1_openapi.json.gz": (
        "44ef306b285fb8dacb4e7e4d6c91a2c42019953fa0b1569b8ce2a89608ca8b93"
    ),
    "apis__networking.k8s.io__v1_openapi.json.gz": (
        "a533bc4f9b6c345ddd2cb8ed82e105cdb6b80e0411eebef919ba2a82da645ff5"
    ),
}
_V2 = (
    "swagger-v1.27.0.json.gz",
    "ecadad734eb65fe73e9612304490398c0c9162cac9787468000fa0fa2af8ba3e",
)
_CRDS = (
    "prometheus-operator/monitoring.coreos.com_servicemonitors.yaml",
    "prometheus-operator/monitoring.coreos.com_prometheusrules.yaml",
    "cert-manager/cert-manager.io_certificates.yaml",
)
_QUANTITY = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
_QUANTITY_NAME = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def _read_checked(name: str, sha256: str) -> Any:
    raw = gzip.decompress((DATA / "kubernetes" / name).read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise ValueError(f"{name}: SHA-256 {digest}, the README records {sha256}")
    return json.loads(raw)


@dataclass
class _Source:
    """One set of named schemas (an OpenAPI document's) and the kinds it defines."""

    name: str
    schemas: dict[str, Any]
    ref_prefix: str
    kinds: dict[tuple[str, str], str] = field(default_factory=dict)  # (apiVersion, kind) -> name

    def index(self) -> None:
        for name, schema in self.schemas.items():
            for gvk in schema.get("x-kubernetes-group-version-kind", []):
                api = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                self.kinds.setdefault((api, gvk["kind"]), name)


class Schemas:
    """Every schema source; ``errors(obj)`` lists what is wrong with one object, per source."""

    def __init__(self) -> None:
        v3: dict[str, Any] = {}
        for name, digest in _V3.items():
            for key, schema in _read_checked(name, digest)["components"]["schemas"].items():
                v3.setdefault(key, schema)
        self.v3 = _Source("OpenAPI v3 (api/openapi-spec/v3)", v3, "#/components/schemas/")
        self.v3.index()
        v2 = _read_checked(*_V2)["definitions"]
        self.v2 = _Source("OpenAPI v2 v1.27.0 (kube-openapi testdata)", v2, "#/definitions/")
        self.v2.index()
        self.crds: dict[tuple[str, str], Any] = {}
        for path in _CRDS:
            crd = yaml.safe_load((DATA / path).read_text())
            for version in crd["spec"]["versions"]:
                api = f"{crd['spec']['group']}/{version['name']}"
                self.crds[(api, crd["spec"]["names"]["kind"])] = version["schema"][
                    "openAPIV3Schema"
                ]

    def sources_for(self, obj: dict[str, Any]) -> list[str]:
        """Which sources know this object's kind (at least one must)."""
        key = (obj.get("apiVersion", ""), obj.get("kind", ""))
        found = [s.name for s in (self.v3, self.v2) if key in s.kinds]
        if key in self.crds:
            found.append("CRD")
        return found

    def errors(self, obj: dict[str, Any]) -> dict[str, list[str]]:
        """Errors per source that defines the object's kind; {} when none defines it."""
        key = (obj.get("apiVersion", ""), obj.get("kind", ""))
        result: dict[str, list[str]] = {}
        for source in (self.v3, self.v2):
            if key in source.kinds:
                schema = {"$ref": source.ref_prefix + source.kinds[key]}
                result[source.name] = _Validator(source).check(obj, schema, "")
        if key in self.crds:
            result["CRD"] = self._crd_errors(obj, self.crds[key])
        return result

    def _crd_errors(self, obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
        # The API server checks a custom resource's metadata as ObjectMeta, whatever its schema.
        body = {k: v for k, v in obj.items() if k != "metadata"}
        trimmed = dict(schema, properties={
            k: v for k, v in schema.get("properties", {}).items() if k != "metadata"
        })  # fmt: skip
        problems = _Validator(self.v3).check(body, trimmed, "")
        meta = {"$ref": self.v3.ref_prefix + _OBJECT_META}
        return problems + _Validator(self.v3).check(obj.get("metadata", {}), meta, ".metadata")


class _Validator:
    def __init__(self, source: _Source) -> None:
        self.source = source

    def resolve(self, schema: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        name = None
        while True:
            if "$ref" in schema:
                name = schema["$ref"].removeprefix(self.source.ref_prefix)
                schema = self.source.schemas[name]
            elif "allOf" in schema and len(schema["allOf"]) == 1 and "$ref" in schema["allOf"][0]:
                schema = schema["allOf"][0]
            else:
                return schema, name

    def check(self, value: Any, schema: dict[str, Any], path: str) -> list[str]:
        schema, name = self.resolve(schema)
        where = path or "."
        if name == _INT_OR_STRING or schema.get("x-kubernetes-int-or-string"):
            if isinstance(value, bool) or not isinstance(value, int | str):
                return [f"{where}: {value!r} is neither an integer nor a string"]
            return self._scalar_limits(value, schema, where)
        if name == _QUANTITY_NAME:
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                return [f"{where}: {value!r} is not a quantity"]
            if not _QUANTITY.match(str(value)):
                return [f"{where}: {value!r} is not a quantity"]
            return []
        if value is None:
            return [] if schema.get("nullable") else [f"{where}: null"]
        for combinator in ("anyOf", "oneOf"):
            if combinator in schema:
                branches = [self.check(value, branch, path) for branch in schema[combinator]]
                if not any(not b for b in branches):
                    return [f"{where}: matches none of {combinator}: {branches}"]
        if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
            return []
        kind = schema.get("type")
        problems: list[str] = []
        if kind == "object" or "properties" in schema or "additionalProperties" in schema:
            if not isinstance(value, dict):
                return [f"{where}: expected an object, got {type(value).__name__}"]
            problems += self._object(value, schema, path)
        elif kind == "array":
            if not isinstance(value, list):
                return [f"{where}: expected a list, got {type(value).__name__}"]
            if len(value) < schema.get("minItems", 0):
                problems.append(f"{where}: {len(value)} items, fewer than minItems")
            if len(value) > schema.get("maxItems", len(value)):
                problems.append(f"{where}: {len(value)} items, more than maxItems")
            for i, item in enumerate(value):
                problems += self.check(item, schema.get("items", {}), f"{path}[{i}]")
        elif kind == "string":
            if not isinstance(value, str):
                return [f"{where}: expected a string, got {value!r}"]
            problems += self._scalar_limits(value, schema, where)
        elif kind == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                return [f"{where}: expected an integer, got {value!r}"]
            problems += self._scalar_limits(value, schema, where)
        elif kind == "number":
            if isinstance(value, bool) or not isinstance(value, int | float):
                return [f"{where}: expected a number, got {value!r}"]
            problems += self._scalar_limits(value, schema, where)
        elif kind == "boolean":
            if not isinstance(value, bool):
                return [f"{where}: expected a boolean, got {value!r}"]
        if "enum" in schema and value not in schema["enum"]:
            problems.append(f"{where}: {value!r} is not one of {schema['enum']}")
        return problems

    def _object(self, value: dict[str, Any], schema: dict[str, Any], path: str) -> list[str]:
        problems = []
        properties = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{path or '.'}: required field {key!r} is missing")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                problems += self.check(item, properties[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                problems += self.check(item, extra, f"{path}.{key}")
            elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields"):
                continue
            else:
                problems.append(f"{path}.{key}: unknown field")
        return problems

    @staticmethod
    def _scalar_limits(value: Any, schema: dict[str, Any], where: str) -> list[str]:
        problems = []
        if isinstance(value, str):
            if "pattern" in schema and not re.search(schema["pattern"], value):
                problems.append(f"{where}: {value!r} does not match {schema['pattern']!r}")
            if len(value) < schema.get("minLength", 0):
                problems.append(f"{where}: {value!r} is shorter than {schema['minLength']}")
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                problems.append(f"{where}: {value!r} is longer than {schema['maxLength']}")
        else:
            if "minimum" in schema and value < schema["minimum"]:
                problems.append(f"{where}: {value} is below {schema['minimum']}")
            if "maximum" in schema and value > schema["maximum"]:
                problems.append(f"{where}: {value} is above {schema['maximum']}")
            if schema.get("format") == "int32" and not -(2**31) <= value < 2**31:
                problems.append(f"{where}: {value} is not an int32")
        return problems


@cache
def load_schemas() -> Schemas:
    return Schemas()
