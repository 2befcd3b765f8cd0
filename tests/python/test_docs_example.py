"""The example in docs/python.md runs as written: its ```python blocks, in order, in one namespace (their asserts
state what the text claims), and the output its comments show is what it prints."""
import contextlib
import io
import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md"


def example_blocks():
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Example", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_example_runs_and_prints_what_it_says():
    blocks = example_blocks()
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, str(DOC), "exec"), namespace)
        shown = [line[2:] for line in block.splitlines() if line.startswith("# ")]
        if shown:  # the commented output lines of a block are what it printed
            assert out.getvalue().splitlines() == shown
