"""``outputs_dir``: where rich outputs are saved (or not), and the text around a saved figure."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from kernelexec import CommandLineExecutor, InvalidPath
from kernelexec._outputs import OutputCollector

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


def _figure(collector: OutputCollector) -> None:
    collector.feed(
        {
            "msg_type": "display_data",
            "content": {
                "data": {"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"},
                "metadata": {},
            },
        }
    )


@pytest.mark.parametrize("folder", ["outputs", "report_files", "deep/er"])
def test_files_land_in_the_folder_and_the_text_names_it(tmp_path: Path, folder: str) -> None:
    c = OutputCollector(
        work_dir=tmp_path, cell=2, limit=10_000, spill_path=None, outputs_dir=folder
    )
    _figure(c)
    collected = c.finish()
    assert (tmp_path / folder / "cell2-1.png").exists()
    assert collected.output == f"[image/png saved to {folder}/cell2-1.png]"  # no <Figure ...>


def test_no_folder_no_files(tmp_path: Path) -> None:
    c = OutputCollector(work_dir=tmp_path, cell=1, limit=10_000, spill_path=None, outputs_dir=None)
    _figure(c)
    collected = c.finish()
    assert list(tmp_path.iterdir()) == []
    assert collected.output == "<Figure size 640x480 with 1 Axes>"  # nothing saved: the repr stays


@pytest.mark.parametrize("bad", ["/abs", "../up", "a/../../b", ""])
def test_outputs_dir_must_stay_inside_the_work_dir(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidPath):
        CommandLineExecutor(work_dir=tmp_path, outputs_dir=bad)


def test_a_display_the_door_refused_says_so_and_why(tmp_path: Path) -> None:
    """``outputs`` replaced by a link (to a host folder) by the code: the figure is not written
    through it, and the result says it was not saved, and why, instead of "saved to"."""
    host = tmp_path / "host"
    host.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "outputs").symlink_to(host, target_is_directory=True)
    c = OutputCollector(work_dir=work, cell=2, limit=10_000, spill_path=None)
    _figure(c)
    collected = c.finish()
    assert list(host.iterdir()) == [] and collected.files == []
    assert "saved to" not in collected.output.replace("not saved to", "")
    assert collected.output.startswith("[image/png not saved to outputs/cell2-1.png: outputs is")
    assert "symbolic link" in collected.output
    [out] = collected.outputs
    assert "symbolic link" in out["metadata"]["kernelexec"]["not_saved"]["image/png"]
    assert out["data"]["image/png"] == PNG  # the payload stays in the outputs
