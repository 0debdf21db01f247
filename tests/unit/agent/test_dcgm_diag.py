"""``dcgmi diag -j`` parsing on real outputs (tests/fixtures/dcgmi_diag/PROVENANCE.md) and the run
around it: banner lines, both document shapes, statuses, and a dcgmi that does not answer."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from fleetwatch.agent.dcgm_diag import DcgmDiag, parse_diag_output, results_of_test

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "dcgmi_diag"
DCGM3 = FIXTURES / "dcgm-3.1.0_8gpu_pass.txt"
DCGM4_TEST = FIXTURES / "dcgm-4_diagnostic-test_8gpu.txt"


def _dcgm4_test() -> dict:
    """The issue #215 test object (it ends in `},` as it stands inside the document)."""
    return json.loads(DCGM4_TEST.read_text().strip().removesuffix(","))


def test_dcgm3_real_output_with_banner_and_nulls_is_one_check_per_test_and_gpu() -> None:
    doc = parse_diag_output(DCGM3.read_text())
    assert doc.version == "3.1.0"
    assert doc.driver_version is None  # this capture does not say
    names = sorted({c.name for c in doc.checks})
    assert names == [
        "dcgm.cuda main library", "dcgm.denylist", "dcgm.environmental variables",
        "dcgm.graphics processes", "dcgm.inforom", "dcgm.nvml library",
        "dcgm.page retirement/row remap", "dcgm.permissions and os-related blocks",
        "dcgm.persistence mode", "dcgm.software",
    ]  # fmt: skip
    # 9 Deployment tests on "0,1,...,7" (split), the Custom test once per numeric gpu_ids
    assert len(doc.checks) == 9 * 8 + 8
    assert {c.status for c in doc.checks} == {"pass"}
    assert sorted({c.gpu_index for c in doc.checks}) == list(range(8))
    software = [c for c in doc.checks if c.name == "dcgm.software"]
    assert [c.gpu_index for c in software] == list(range(8))


def test_dcgm4_real_test_object_reads_entities_as_gpus() -> None:
    checks = list(results_of_test(_dcgm4_test()))
    assert [(c.name, c.gpu_index, c.status) for c in checks] == [
        ("dcgm.diagnostic", gpu, "pass") for gpu in range(8)
    ]


def test_dcgm4_document_root_and_metadata_from_dcgms_own_key_names() -> None:
    """The real DCGM 4 test object inside the DCGM 4 root (key names from NvvsJsonStrings.h)."""
    test = _dcgm4_test()
    test["results"][5]["status"] = "Fail"
    test["results"][5]["warnings"] = [{"warning": "GPU 5 failed the diagnostic", "error_id": 3}]
    document = {
        "DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [test]}]},
        "entity_groups": [],
        "metadata": {"version": "4.1.1", "Driver Version Detected": "570.124.06"},
    }
    doc = parse_diag_output("Successfully ran diagnostic for group.\n" + json.dumps(document))
    assert (doc.version, doc.driver_version) == ("4.1.1", "570.124.06")
    failed = [c for c in doc.checks if c.status == "fail"]
    assert [(c.label, c.message) for c in failed] == [
        ("dcgm.diagnostic on GPU 5", "GPU 5 failed the diagnostic")
    ]


@pytest.mark.parametrize(
    ("word", "status"),
    [("Pass", "pass"), ("FAIL", "fail"), ("Warn", "warn"), ("Skip", "skip"),
     ("Not Run", "skip"), ("Inconclusive", "fail"), ("", "fail")],
)  # fmt: skip
def test_statuses_and_an_unknown_word_is_never_a_pass(word: str, status: str) -> None:
    test = _dcgm4_test()
    test["results"] = test["results"][:1]
    test["results"][0]["status"] = word
    (check,) = results_of_test(test)
    assert check.status == status
    if status == "fail" and word.lower() != "fail":
        assert "status" in (check.message or "")


def test_a_non_gpu_entity_is_named_not_given_a_gpu_index() -> None:
    test = {
        "name": "cpu_eud",
        "results": [{"entity_group": "CPU", "entity_id": 0, "status": "Pass"}],
    }
    (check,) = results_of_test(test)
    assert (check.name, check.gpu_index) == ("dcgm.cpu_eud/cpu0", None)


@pytest.mark.parametrize(
    "text",
    ["", "Error: unable to connect to host engine", '{"no": "diagnostic"}', "{broken",
     '{"DCGM Diagnostic": {"test_categories": []}}'],
)  # fmt: skip
def test_output_without_results_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_diag_output(text)


def test_runtime_error_is_a_failed_check() -> None:
    doc = parse_diag_output('{"DCGM GPU Diagnostic": {"runtime_error": "NVVS failed to start"}}')
    assert [(c.name, c.status, c.message) for c in doc.checks] == [
        ("dcgm.diag", "fail", "NVVS failed to start")
    ]


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "dcgmi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_failing_dcgmi_exit_status_is_read_from_its_document(tmp_path: Path) -> None:
    """dcgmi exits non-zero when a test fails: the document, not the status, is the verdict."""
    out = tmp_path / "out.txt"
    out.write_bytes(DCGM3.read_bytes())
    diag = DcgmDiag(_script(tmp_path, f'cat "{out}"\nexit 226\n'))
    doc = diag.run(1)
    assert diag.available and len(doc.checks) == 80
    assert {c.status for c in doc.checks} == {"pass"}


def test_dcgmi_that_prints_no_document_fails_with_what_it_said(tmp_path: Path) -> None:
    diag = DcgmDiag(
        _script(tmp_path, 'echo "Error: unable to connect to host engine" >&2\nexit 1\n')
    )
    (check,) = diag.run(2).checks
    assert (check.name, check.status) == ("dcgm.diag", "fail")
    assert "exited 1" in (check.message or "") and "host engine" in (check.message or "")


def test_dcgmi_past_its_timeout_fails(tmp_path: Path) -> None:
    diag = DcgmDiag(_script(tmp_path, "exec sleep 30\n"), timeout_s=0.5)
    (check,) = diag.run(1).checks
    assert (check.status, check.message) == ("fail", "dcgmi diag -r 1 did not finish within 0.5 s")


def test_no_dcgmi_is_absent_never_a_pass(tmp_path: Path) -> None:
    diag = DcgmDiag(str(tmp_path / "no-such-dcgmi"))
    assert not diag.available
    (check,) = diag.run(1).checks
    assert (check.name, check.status) == ("dcgm.diag", "absent")
    assert os.sep not in (check.message or "")
