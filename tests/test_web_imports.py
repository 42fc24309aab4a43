"""The web path stays lean: a gunicorn worker never imports the forecasting stack.

scipy and pandas cost each web worker ~100 MB and a second at boot, and no page or
API view needs them (they run in the Celery worker). Checked in a fresh interpreter, since this
test process has long imported everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("scipy", "pandas")

# What a web worker loads: the WSGI app, every view behind every URL, every template tag
# library, and the admin's registrations. Prints the heavy top-level packages then in memory.
WEB_PATH = """
import json, sys
import config.wsgi  # noqa: F401  (django.setup(): apps, receivers, the Celery app)
from django.contrib import admin
from django.template.backends.django import get_installed_libraries
from django.urls import get_resolver
from importlib import import_module

def walk(resolver):
    for pattern in resolver.url_patterns:
        if hasattr(pattern, "url_patterns"):
            walk(pattern)
        else:
            pattern.callback  # resolves (imports) the view

walk(get_resolver())
for module in get_installed_libraries().values():
    import_module(module)
admin.autodiscover()
EXTRA
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(HEAVY))))
"""


def _heavy_after(extra: str = "") -> list[str]:
    code = WEB_PATH.replace("EXTRA", extra).replace("HEAVY", repr(HEAVY))
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="config.settings.base")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_it_serves_every_url_without_the_forecasting_stack() -> None:
    assert _heavy_after() == []


def test_it_notices_when_the_web_path_pulls_the_stack_in() -> None:
    # The check itself: the same process with the worker's module imported does show them,
    # so an empty list above means "not imported", not "not looked for".
    assert set(_heavy_after("import forecasting.compute")) >= {"scipy", "pandas"}
