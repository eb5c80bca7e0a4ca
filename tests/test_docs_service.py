"""The blocks of docs/service.md run as a user runs them, under Ray: the first run on a local
cluster, the Ray Train recipe (two workers), and the torchrun recipe (two trainer
processes joining a cluster started with `ray start --head`).

Ray is the `distributed` extra, not in README's test command: there these tests skip, saying
so; .ci/run's distributed engines section runs them with STOKER_REQUIRE_RAY=1."""

import os
import shutil
import subprocess
import sys

import pytest
from test_docs import ROOT, blocks, run_block

if not os.environ.get("STOKER_REQUIRE_RAY"):
    pytest.importorskip("ray", reason="Ray is the `distributed` extra (pip install "
                        "'stoker[distributed]'); .ci/run's distributed engines section runs "
                        "these tests")

PAGE = ROOT / "docs" / "service.md"
BLOCKS = {b.line: b for b in blocks(PAGE) if b.run_by == "tests/test_docs_service.py"}
pytestmark = pytest.mark.timeout(400)  # each block a subprocess with its own timeout


def block(title):
    """The block under the page's section `title`."""
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## ") and title in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
               len(lines))
    (b,) = [b for line, b in BLOCKS.items() if start < line <= end]
    return b


def test_every_block_of_the_page_is_here():
    assert len(BLOCKS) == 3


def test_first_run(tmp_path):
    run_block(block("A first run"), tmp_path)


def test_ray_train_recipe(tmp_path):
    run_block(block("Recipe: Ray Train"), tmp_path)


def test_torchrun_recipe(tmp_path):
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    ray_cli = ray_cli if os.path.exists(ray_cli) else shutil.which("ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    subprocess.run([ray_cli, "start", "--head", "--num-cpus=3", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, env=env, capture_output=True,
                   timeout=120)
    try:
        run_block(block("Recipe: `torchrun` trainers"), tmp_path)
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True,
                       timeout=120)
