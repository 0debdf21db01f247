"""The fleet map's SVG, asserted mark by mark: per node at a small fleet, per rack above the
limit, worst state first, every tile a link, the legend counting nodes."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from fleetwatch.charts.fleet_map import FILL, MapNode, fleet_map_svg, state_counts, worst

SVG = "{http://www.w3.org/2000/svg}"


def _tiles(svg: str) -> list[ET.Element]:
    return ET.fromstring(svg).findall(f".//{SVG}a/{SVG}rect")


def test_worst_orders_states_and_defaults_to_healthy() -> None:
    assert worst(["healthy", "maintenance", "at_risk", "draining"]) == "at_risk"
    assert worst(["healthy", "out", "unreachable"]) == "unreachable"
    assert worst([]) == "healthy"


def test_state_counts_names_every_state_worst_first() -> None:
    nodes = [MapNode("a", "healthy"), MapNode("b", "out"), MapNode("c", "healthy")]
    assert state_counts(nodes) == {
        "unreachable": 0,
        "out": 1,
        "at_risk": 0,
        "draining": 0,
        "unheard": 0,
        "maintenance": 0,
        "healthy": 2,
    }


def test_fleet_map_per_node_draws_each_node_with_its_state_fill_and_link() -> None:
    nodes = [
        MapNode("n10", "healthy", rack="r2"),
        MapNode("n2", "out", rack="r2"),
        MapNode("n1", "unreachable", rack="r10"),
        MapNode("loose", "draining"),
    ]
    svg = fleet_map_svg(nodes)
    root = ET.fromstring(svg)
    assert "per-node" in root.get("class", "")
    links = root.findall(f".//{SVG}a")
    assert [a.get("href") for a in links] == [
        "/nodes/n2",
        "/nodes/n10",
        "/nodes/n1",
        "/nodes/loose",
    ]
    tiles = _tiles(svg)
    assert [(t.get("data-node"), t.get("data-state"), t.get("fill")) for t in tiles] == [
        ("n2", "out", FILL["out"]),
        ("n10", "healthy", FILL["healthy"]),
        ("n1", "unreachable", FILL["unreachable"]),
        ("loose", "draining", FILL["draining"]),
    ]
    assert tiles[0].get("class") == "tile s-out"
    assert tiles[0].findtext(f"{SVG}title") == "n2: out by rule"
    # one line per rack, natural order (r2 before r10), unlabelled nodes last
    labels = [t.text for t in root.findall(f"{SVG}text")]
    assert labels[:3] == ["r2", "r10", "(no rack label)"]
    assert [t.get("y") for t in tiles] == ["0", "0", "18", "36"]
    assert [t.get("x") for t in tiles] == ["110", "126", "110", "110"]


def test_fleet_map_legend_counts_nodes_and_hides_unheard_when_none() -> None:
    nodes = [MapNode(f"n{i}", "healthy", rack="r1") for i in range(3)] + [
        MapNode("m", "maintenance", rack="r1")
    ]
    root = ET.fromstring(fleet_map_svg(nodes))
    legend = {g.get("data-state"): g.get("data-count") for g in root.iter(f"{SVG}g")}
    assert legend == {
        "unreachable": "0",
        "out": "0",
        "at_risk": "0",
        "draining": "0",
        "maintenance": "1",
        "healthy": "3",
    }
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "in maintenance 1" in texts and "healthy 3" in texts


def test_fleet_map_above_the_limit_draws_racks_by_row_with_the_worst_state() -> None:
    nodes = [MapNode(f"a{i}", "healthy", rack="r1", row="1") for i in range(4)]
    nodes += [
        MapNode("b0", "healthy", rack="r2", row="1"),
        MapNode("b1", "at_risk", rack="r2", row="1"),
    ]
    nodes += [
        MapNode("c0", "maintenance", rack="r3", row="2"),
        MapNode("c1", "out", rack="r3", row="2"),
    ]
    svg = fleet_map_svg(nodes, node_limit=5)
    root = ET.fromstring(svg)
    assert "per-rack" in root.get("class", "")
    tiles = _tiles(svg)
    assert [(t.get("data-rack"), t.get("data-state"), t.get("data-nodes")) for t in tiles] == [
        ("r1", "healthy", "4"),
        ("r2", "at_risk", "2"),
        ("r3", "out", "2"),
    ]
    hrefs = [a.get("href") for a in root.findall(f".//{SVG}a")]
    assert hrefs == ["/nodes/a0", "/nodes/b1", "/nodes/c1"]  # the node that made the colour
    assert tiles[2].findtext(f"{SVG}title") == (
        "r3: 2 nodes (1 out by rule, 1 in maintenance); opens c1"
    )
    labels = [t.text for t in root.findall(f"{SVG}text")]
    assert labels[:2] == ["row 1", "row 2"]


def test_fleet_map_chunks_unlabelled_nodes_above_the_limit() -> None:
    nodes = [MapNode(f"n{i:03d}", "healthy") for i in range(70)]
    root = ET.fromstring(fleet_map_svg(nodes, node_limit=10, chunk=32))
    racks = [t.get("data-rack") for t in root.findall(f".//{SVG}a/{SVG}rect")]
    assert racks == ["n000 … n031", "n032 … n063", "n064 … n069"]


def test_fleet_map_wraps_long_racks_and_escapes_names() -> None:
    nodes = [MapNode(f"n{i}", "healthy", rack="big") for i in range(70)]
    nodes.append(MapNode('x"<&>', "out", rack="big"))
    svg = fleet_map_svg(nodes)
    tiles = _tiles(svg)
    assert len(tiles) == 71
    per_line = (1200 - 110) // 16
    assert tiles[per_line].get("y") == "18" and tiles[per_line].get("x") == "110"
    assert tiles[-1].get("data-node") == 'x"<&>'  # n0 ... n69, then x (natural order)
    assert "/nodes/x%22%3C%26%3E" in svg
    assert re.search(r"<rect[^>]*data-node=\"x&quot;&lt;&amp;&gt;\"", svg)
