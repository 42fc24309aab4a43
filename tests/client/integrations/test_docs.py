"""docs/integrations.md shows the example files that the integration tests run, verbatim."""

from __future__ import annotations

import re

from tests.client.integrations.conftest import EXAMPLES, ROOT


def test_the_docs_show_the_tested_examples_verbatim() -> None:
    page = (ROOT / "docs" / "integrations.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    for name in ("lightning_example.py", "transformers_example.py"):
        assert (EXAMPLES / name).read_text() in blocks, f"{name} differs from docs/integrations.md"
