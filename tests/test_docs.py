"""The README is a front door and the guides' figures come from stored runs.

- Every block `scripts/render_doc_tables.py` renders (tables and transcripts in README.md and
  docs/) equals its render from the stored runs in tests/fixtures/runs/docs/, the stored logs
  and shadowlab's deterministic code; an edited figure is caught, naming its document and block.
- The README stays within 150 lines; its first commands (`shadowlab init`, then the dry run of
  what it wrote) work as written.
- Every relative link in README.md and docs/ points at a file that exists.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _script():
    spec = importlib.util.spec_from_file_location("render_doc_tables", REPO / "scripts" / "render_doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_doc_tables = _script()


@pytest.fixture(scope="module")
def texts() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in render_doc_tables.documents()}


@pytest.fixture(scope="module")
def rendered(texts) -> dict[str, str]:
    assert render_doc_tables.check_names(texts) == []
    return render_doc_tables.render(name for text in texts.values() for name, _ in render_doc_tables.blocks(text))


def test_every_rendered_block_matches_its_stored_run(texts, rendered):
    found = render_doc_tables.differences(texts, rendered)
    assert not found, "\n".join(found) + "\nrerun: python scripts/render_doc_tables.py (and review the diff)"


def test_an_edited_figure_is_caught_naming_its_document_and_block(texts, rendered):
    traffic = REPO / "docs" / "traffic.md"
    (name, body), *_ = [b for b in render_doc_tables.blocks(texts[traffic]) if b[0] == "traffic-reference"]
    assert "| 69.8 % |" in body  # affinity's recovered share in the stored run
    edited = texts[traffic].replace(body, body.replace("| 69.8 % |", "| 69.9 % |", 1))
    (found,) = render_doc_tables.differences({traffic: edited}, rendered)
    assert found.startswith("docs/traffic.md: block traffic-reference differs from its stored run")
    assert "-| `affinity` |" in found and "69.9 %" in found and "+| `affinity` |" in found


def test_a_block_naming_no_renderer_is_refused(texts):
    extra = {README: texts[README] + "<!-- rendered by scripts/render_doc_tables.py: typo -->\n"
                                     "<!-- end rendered: typo -->\n"}
    assert "unknown block 'typo'" in render_doc_tables.check_names({**texts, **extra})


def test_the_case_study_shape_shown_is_the_preset(rendered):
    from shadowlab import traffic

    text = rendered["case-study-shape"].removeprefix("```yaml\n").removesuffix("```\n")
    assert traffic.shape_from_dict(yaml.safe_load(text)) == traffic.TrafficShape.case_study()


# ---------------------------------------------------------------- the README


def test_the_readme_is_a_front_door():
    """Guides go to docs/ (that .ci/run finds both its commands there: tests/shadowlab/test_cli.py)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; guides go to docs/"


def test_the_readme_first_commands_write_a_matrix_that_plans(tmp_path):
    """`shadowlab init` as the README's first screen gives it (its build and GGUF are the
    reader's: stand-ins here), then the dry run of what it wrote."""
    text = README.read_text(encoding="utf-8")
    first = text[:text.index("## How it works")]
    (init,) = [line for line in first.splitlines() if line.startswith("shadowlab init ")]
    model = tmp_path / "my-model.gguf"
    model.write_bytes(b"GGUF")
    argv = shlex.split(init.replace("/opt/llama.cpp/build/bin/llama-server", sys.executable)
                       .replace("/models/my-model.gguf", str(model)))
    done = subprocess.run([sys.executable, "-m", "shadowlab", *argv[1:]], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    run_line = next(line for line in first.splitlines() if line.startswith("shadowlab run "))
    matrix = run_line.split()[2]
    assert (tmp_path / matrix).exists()
    done = subprocess.run([sys.executable, "-m", "shadowlab", "run", matrix, "--dry-run"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(f"mine.{c}.{s}" in done.stdout for c in ("current", "candidate")
               for s in ("A-C", "A-B-C", "A-B-A", "append", "traffic"))
    assert "pip install -e .\n" in first  # the harness alone: no torch on this path


# ---------------------------------------------------------------- links

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_in_the_docs_resolves():
    broken = []
    for doc in render_doc_tables.documents():
        for target in LINK.findall(doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert not broken, broken
