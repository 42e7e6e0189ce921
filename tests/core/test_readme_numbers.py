"""The README's measured-speed block is exactly what the committed suite run gives: no
number in it that benchmarks/results/suite.json does not hold."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tables():
    spec = importlib.util.spec_from_file_location("readme_tables", os.path.join(ROOT, "benchmarks", "readme_tables.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_block_matches_the_committed_suite_run(capsys):
    assert _tables().main(["--check"]) == 0, capsys.readouterr().err


def test_a_changed_number_is_caught(tmp_path):
    tables = _tables()
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = readme[readme.index(tables.BEGIN):readme.index(tables.END)]
    row = next(line for line in block.splitlines() if line.startswith("| 128 | no | 16k |"))
    cells = row.split(" | ")
    cells[3] = str(int(cells[3]) + 1)           # the xsync TFLOP/s of one grid point
    edited = tmp_path / "README.md"
    edited.write_text(readme.replace(row, " | ".join(cells)))
    assert tables.main(["--check", "--readme", str(edited)]) == 1
