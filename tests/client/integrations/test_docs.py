"""docs/integrations.md shows the example files that the integration tests run, verbatim."""

from __future__ import annotations

import ast
import re
import sys

import pytest

from tests.client.integrations.conftest import EXAMPLES, ROOT


def test_the_docs_show_the_tested_examples_verbatim() -> None:
    page = (ROOT / "docs" / "integrations.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    for name in ("lightning_example.py", "transformers_example.py"):
        assert (EXAMPLES / name).read_text() in blocks, f"{name} differs from docs/integrations.md"


# Third-party modules an example needs, and what installs each. torch comes with either
# framework; the stdlib and the examples' own modules need nothing.
PROVIDED_BY = {
    "lightning": "runcast[lightning]",
    "transformers": "runcast[transformers]",
    "accelerate": "runcast[transformers]",
}


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("name", ["lightning_example.py", "transformers_example.py"])
def test_each_example_says_how_to_install_everything_it_imports(name: str) -> None:
    # The Lightning example's tiny GPT is a transformers GPT2Config: `runcast[lightning]` alone
    # failed on `import transformers` with nothing in the example or the page saying so.
    needs = _imports(EXAMPLES / name)
    if "tiny_gpt" in needs:
        needs |= _imports(EXAMPLES / "tiny_gpt.py")
    needs -= set(sys.stdlib_module_names) | {"__future__", "runcast", "tiny_gpt", "torch"}
    line = re.search(r"^Needs: pip install (.+)$", (EXAMPLES / name).read_text(), flags=re.M)
    assert line, f"{name} does not say what to install"
    installs = set(re.findall(r"[\w\[\]-]+", line.group(1).split("  ")[0].replace("'", "")))
    for module in sorted(needs):
        assert module in installs or PROVIDED_BY.get(module) in installs, (name, module)
