"""The ingest wire format is a public API: documented in OpenAPI with its schema and an example."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from fleetwatch.telemetry import BATCH_EXAMPLE, SAMPLE_FIELD_NAMES


def test_openapi_documents_the_ingest_body_schema_example_and_errors(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    ingest = spec["paths"]["/v1/ingest"]["post"]
    body = ingest["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/Batch"}
    assert body["examples"]["one_gpu_one_xid"]["value"] == json.loads(json.dumps(BATCH_EXAMPLE))
    schemas = spec["components"]["schemas"]
    # Every $ref the Batch schema uses resolves, and every canonical field is documented.
    assert {"Batch", "NodeInfo", "GpuIdentity", "GpuSample", "Event"} <= set(schemas)
    assert set(SAMPLE_FIELD_NAMES) <= set(schemas["GpuSample"]["properties"])
    assert {"401", "403", "409", "413", "415", "422"} <= set(ingest["responses"])
    refs = [v for v in _walk(spec) if isinstance(v, str) and v.startswith("#/components/")]
    assert all(ref.split("/")[-1] in schemas for ref in refs)
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    # Optional, so older agents' batches stay valid; described, so other pushers can use it.
    node = schemas["NodeInfo"]
    assert "push_interval_s" in node["properties"] and "push_interval_s" not in node["required"]
    assert "unreachable" in node["properties"]["push_interval_s"]["description"]


def test_docs_page_is_served_without_a_token(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and "swagger" in page.text.lower()


def _walk(node: object) -> list[object]:
    if isinstance(node, dict):
        return [v for value in node.values() for v in _walk(value)] + list(node.values())
    if isinstance(node, list):
        return [v for value in node for v in _walk(value)]
    return []
