"""The W&B offline-file reader (``fusebench.app.wandb_files``, W&B's private file layout) against the installed
wandb: fails naming wandb's version and the field when W&B changes what the reader relies on."""

import json
from pathlib import Path

import pytest

from fusebench.app import wandb_files

wandb = pytest.importorskip("wandb")
FIXTURE = Path(__file__).parent / "fixtures" / "wandb-0.31.0-offline.wandb"  # wandb 0.31.0: init, log({"a": 1}), finish


def test_the_installed_wandb_has_every_field_the_reader_uses():
    problems = wandb_files.shape_problems()
    assert not problems, "W&B changed what fusebench.app.wandb_files reads:\n" + "\n".join(problems)


def test_the_installed_wandb_is_a_version_the_reader_was_checked_against():
    import google.protobuf

    assert wandb.__version__ in wandb_files.CHECKED["wandb"], (
        f"wandb {wandb.__version__} is installed; fusebench.app.wandb_files was checked against wandb "
        f"{', '.join(wandb_files.CHECKED['wandb'])}: run tests/test_tracking.py (it writes and reads a real offline "
        f"run), then add the version to CHECKED")
    assert google.protobuf.__version__ in wandb_files.CHECKED["protobuf"], (
        f"protobuf {google.protobuf.__version__} is installed; fusebench.app.wandb_files was checked against "
        f"{', '.join(wandb_files.CHECKED['protobuf'])}: run tests/test_tracking.py, then add it to CHECKED")


def test_a_file_wandb_wrote_reads_back_what_was_logged():
    records = wandb_files.read_wandb_file(FIXTURE)
    kinds = [r.WhichOneof("record_type") for r in records]
    assert "run" in kinds and "history" in kinds and "exit" in kinds
    history = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for h in history for i in h.item}
    assert items["a"] == 1  # as tests/test_tracking.py reads a run's history and summary


def test_a_file_of_another_layout_is_named(tmp_path):
    other = tmp_path / "run.wandb"
    data = FIXTURE.read_bytes()
    other.write_bytes(data[:6] + b"\x01" + data[7:])  # the log version byte
    with pytest.raises(ValueError, match="a W&B run file of another layout"):
        wandb_files.read_wandb_file(other)
    other.write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ValueError, match="is not a W&B run file"):
        wandb_files.read_wandb_file(other)
