"""Every notebook in notebooks/ runs top to bottom (so none can go stale), draws its plots, and stays fast.

The kernel is this interpreter (a kernelspec written into a temporary JUPYTER_PATH), so the notebooks import the
planner under test whatever kernels the machine has installed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
import pytest
from ipykernel.kernelspec import install
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
#: the issue's budget for one notebook, kernel start included
MAX_SECONDS = 30


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("kernel")
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))  # searched before any installed kernel
    install(prefix=str(prefix), kernel_name="python3")  # argv[0] = sys.executable
    mp.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    yield sys.executable
    mp.undo()


def test_there_are_at_least_three_notebooks():
    assert len(NOTEBOOKS) >= 3
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{path.name}: clear outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_env):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=MAX_SECONDS * 2,
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError, with the cell and traceback, if any cell fails
    elapsed = time.perf_counter() - t0
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})]
    assert images, f"{path.name} drew no plot"
    assert elapsed < MAX_SECONDS, f"{path.name} took {elapsed:.1f} s"
