"""Read MLflow requests and check them by MLflow's rules (mlflow/utils/validation.py, as its
server applies them), naming the offending field the way MLflow does (`metrics[3].value`).

Inputs arrive as JSON bodies (POST) or query strings (GET). MLflow's client writes int64 fields
as JSON numbers or strings and non-finite doubles as "NaN"/"Infinity"/"-Infinity": both forms
are accepted. Django-free apart from nothing: these are plain functions over dicts.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import posixpath
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracker import limits
from tracker.mlflow.errors import MlflowError, invalid, missing
from tracker.services import SeriesIn

logger = logging.getLogger(__name__)

# MLflow's documented limits (mlflow.utils.validation).
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_ENTITIES_PER_BATCH = 1000
MAX_BATCH_LOG_REQUEST_SIZE = 1_000_000
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_EXPERIMENT_NAME_LENGTH = 500
MAX_EXPERIMENT_TAG_VAL_LENGTH = 20000
MAX_ENTITY_KEY_LENGTH = 250
MAX_RESULTS_SEARCH = 50000
# Runcast's own, tighter where its storage is: a metric key is at most 200 characters.
MAX_METRIC_KEY_LENGTH = min(MAX_ENTITY_KEY_LENGTH, limits.MAX_KEY_LENGTH)
# No run or experiment has a longer id (Run.public_id, Experiment.public_id): a longer one is
# refused naming its field, not looked up and answered "not found".
MAX_RUN_ID_LENGTH = 64
MAX_EXPERIMENT_ID_LENGTH = 32

_NAME = re.compile(r"^[/\w.\- :]*$")
_NON_FINITE = {"nan": math.nan, "infinity": math.inf, "-infinity": -math.inf, "inf": math.inf}
_NON_FINITE.update({"-inf": -math.inf, "+infinity": math.inf})
MAX_TIMESTAMP_MS = int(limits.MAX_EPOCH_S * 1000)


def invalid_value(path: str, value: Any, why: str | None = None) -> MlflowError:
    shown = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    tail = f": {why}" if why else "."
    return invalid(f"Invalid value {limits.echo(shown)} for parameter '{path}' supplied{tail}")


def too_long(path: str, limit: int) -> MlflowError:
    return invalid(f"'{path}' exceeds the maximum length of {limit} characters")


# --- reading a request ---------------------------------------------------------------------


def body_json(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise MlflowError(f"Malformed JSON request body: {exc}", "BAD_REQUEST") from exc
    if isinstance(data, str):
        # Old clients double-encode the body; MLflow's server accepts that too.
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise MlflowError("Malformed JSON request body", "BAD_REQUEST") from exc
    if not isinstance(data, dict):
        raise MlflowError("The request body must be a JSON object", "BAD_REQUEST")
    return data


# --- scalar fields ---------------------------------------------------------------------------


def string(data: dict[str, Any], name: str, *, required: bool = False, path: str = "") -> str:
    value = data.get(name)
    where = path or name
    if value is None or value == "":
        if required:
            raise missing(where)
        return ""
    if not isinstance(value, str):
        raise invalid_value(where, value, "must be a string")
    if "\x00" in value:
        raise invalid_value(where, value, "must not contain NUL (U+0000) characters")
    return value


def run_id_of(data: dict[str, Any]) -> str:
    # Clients send both `run_id` and the deprecated `run_uuid`; either names the run.
    run_id = string(data, "run_id")
    field = "run_id"
    if not run_id:
        run_id, field = string(data, "run_uuid"), "run_uuid"
    if not run_id:
        raise missing("run_id")
    return id_checked(run_id, field, MAX_RUN_ID_LENGTH)


def id_checked(value: str, path: str, limit: int) -> str:
    if len(value) > limit:
        raise too_long(path, limit)
    return value


def experiment_id_checked(value: str, path: str) -> str:
    """Every experiment id is a digit string (services._new_experiment_id), as in MLflow's SQL
    store, which refuses another id as not an integer rather than answering "not found"."""
    id_checked(value, path, MAX_EXPERIMENT_ID_LENGTH)
    if not (value.isascii() and value.isdigit()):
        raise invalid_value(path, value, "must be a digit string")
    return value


def integer(value: Any, path: str, *, default: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise invalid_value(path, value, "must be an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise invalid_value(path, value, "must be an integer")


def double(value: Any, path: str) -> float:
    if value is None or value == "":
        raise missing(path)
    if isinstance(value, bool):
        raise invalid_value(path, value, "Please specify value as a valid double (64-bit float)")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        special = _NON_FINITE.get(value.strip().lower())
        if special is not None:
            return special
        try:
            return float(value)
        except ValueError:
            pass
    raise invalid_value(path, value, "Please specify value as a valid double (64-bit float)")


def array(data: dict[str, Any], name: str) -> list[Any]:
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_value(name, value, "must be an array")
    return value


def string_list(data: dict[str, Any], name: str) -> list[str]:
    out = []
    for i, item in enumerate(array(data, name)):
        if not isinstance(item, str):
            raise invalid_value(f"{name}[{i}]", item, "must be a string")
        out.append(item)
    return out


def check_name(name: str, path: str) -> None:
    """MLflow's rule for metric, param and tag keys (on a POSIX server)."""
    problem = _name_problem(name)
    if problem is not None:
        raise invalid_value(path, name, problem)


# A log-batch repeats a few keys up to 1,000 times: checking each once per process took an
# eighth of such a request's server time.
@functools.lru_cache(maxsize=4096)
def _name_problem(name: str) -> str | None:
    if not _NAME.match(name):
        return (
            "Names may only contain alphanumerics, underscores (_), dashes (-), periods (.), "
            "spaces ( ), colon(:) and slashes (/)."
        )
    norm = posixpath.normpath(name)
    if norm != name or norm == "." or norm.startswith("..") or norm.startswith("/"):
        return (
            "Names may be treated as files in certain cases, and must not resolve to other "
            f"names when treated as such. This name would resolve to {limits.echo(norm)!r}"
        )
    return None


def experiment_name(data: dict[str, Any], field: str) -> str:
    name = string(data, field, required=True)
    if len(name) > MAX_EXPERIMENT_NAME_LENGTH:
        raise invalid(
            f"Experiment name exceeds the maximum length of {MAX_EXPERIMENT_NAME_LENGTH} characters"
        )
    return name


# --- key/value entities ----------------------------------------------------------------------


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: str


def key_value(item: Any, path: str, *, value_limit: int) -> KeyValue:
    """One param or tag (they share MLflow's rules but for the value's length)."""
    if not isinstance(item, dict):
        raise invalid_value(path, item, "must be an object with 'key' and 'value'")
    key = string(item, "key", required=True, path=f"{path}.key" if path else "key")
    check_name(key, f"{path}.key" if path else "key")
    if len(key) > MAX_ENTITY_KEY_LENGTH:
        raise too_long(f"{path}.key" if path else "key", MAX_ENTITY_KEY_LENGTH)
    raw = item.get("value")
    if raw is None:
        raw = ""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = str(raw)  # lenient like MLflow's proto parser, which takes numbers for strings
    value = string({"value": raw}, "value", path=f"{path}.value" if path else "value")
    if len(value) > value_limit:
        # As MLflow's store does (MLFLOW_TRUNCATE_LONG_VALUES, on by default): a script that
        # logs a long config must not crash over it. The server log says what was cut.
        logger.warning(
            "MLflow %s '%s' of %d characters truncated to %d characters",
            f"{path}.value" if path else "value",
            limits.echo(key),
            len(value),
            value_limit,
        )
        value = value[:value_limit]
    return KeyValue(key=key, value=value)


def params_of(items: list[Any], *, path: str = "params") -> list[KeyValue]:
    params = [
        key_value(p, f"{path}[{i}]", value_limit=MAX_PARAM_VAL_LENGTH) for i, p in enumerate(items)
    ]
    keys = [p.key for p in params]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        shown = [limits.echo(k) for k in dupes[:5]] + (
            [f"{len(dupes) - 5} more"] if len(dupes) > 5 else []
        )
        raise invalid(
            f"Duplicate parameter keys have been submitted: {shown}. Please ensure the request "
            "contains only one param value per param key."
        )
    return params


def tags_of(items: list[Any], *, path: str = "tags") -> list[KeyValue]:
    return [
        key_value(t, f"{path}[{i}]", value_limit=MAX_TAG_VAL_LENGTH) for i, t in enumerate(items)
    ]


# --- metrics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricIn:
    key: str
    value: float
    timestamp_ms: int
    step: int
    # MLflow 3: a metric may also belong to a logged model (log_model links the run's metrics
    # of its step to the model) and name the dataset it was computed on.
    model_id: str = ""
    dataset_name: str = ""
    dataset_digest: str = ""


def metric_of(item: Any, path: str) -> MetricIn:
    if not isinstance(item, dict):
        raise invalid_value(path, item, "must be an object")
    p = f"{path}." if path else ""
    key = string(item, "key", required=True, path=f"{p}key")
    check_name(key, f"{p}key")
    if len(key) > MAX_METRIC_KEY_LENGTH:
        raise too_long(f"{p}key", MAX_METRIC_KEY_LENGTH)
    value = double(item.get("value"), f"{p}value")
    if item.get("timestamp") in (None, ""):
        raise missing(f"{p}timestamp")
    timestamp = integer(item.get("timestamp"), f"{p}timestamp")
    assert timestamp is not None
    if not 0 <= timestamp <= MAX_TIMESTAMP_MS:
        raise invalid_value(
            f"{p}timestamp",
            timestamp,
            f"metric '{limits.echo(key)}' (value={value}). Timestamp must be a nonnegative long "
            f"(64-bit integer) of milliseconds since the epoch, at most {MAX_TIMESTAMP_MS}",
        )
    step = integer(item.get("step"), f"{p}step", default=0)
    assert step is not None
    if abs(step) > limits.MAX_ABS_STEP:
        raise invalid_value(f"{p}step", step, f"Step must be within ±{limits.MAX_ABS_STEP}")
    model_id = string(item, "model_id", path=f"{p}model_id")
    return MetricIn(
        key=key,
        value=value,
        timestamp_ms=timestamp,
        step=step,
        model_id=id_checked(model_id, f"{p}model_id", MAX_RUN_ID_LENGTH),
        dataset_name=string(item, "dataset_name", path=f"{p}dataset_name")[:500],
        dataset_digest=string(item, "dataset_digest", path=f"{p}dataset_digest")[:64],
    )


def batch_limits(metrics: list[Any], params: list[Any], tags: list[Any]) -> None:
    for name, limit, count in (
        ("metrics", MAX_METRICS_PER_BATCH, len(metrics)),
        ("params", MAX_PARAMS_TAGS_PER_BATCH, len(params)),
        ("tags", MAX_PARAMS_TAGS_PER_BATCH, len(tags)),
        (
            "metrics, params, and tags",
            MAX_ENTITIES_PER_BATCH,
            len(metrics) + len(params) + len(tags),
        ),
    ):
        if count > limit:
            raise invalid(
                f"A batch logging request can contain at most {limit} {name}. Got {count} "
                f"{name}. Please split up {name} across multiple requests and try again."
            )


def series_of(metrics: list[MetricIn]) -> list[SeriesIn]:
    """Group points by key, keeping each key's logging order (its history is kept as sent)."""
    grouped: dict[str, list[MetricIn]] = {}
    for m in metrics:
        grouped.setdefault(m.key, []).append(m)
    return [
        SeriesIn(
            key=key,
            steps=np.fromiter((m.step for m in ms), dtype=np.int64, count=len(ms)),
            values=np.fromiter((m.value for m in ms), dtype=np.float64, count=len(ms)),
            times=np.fromiter((m.timestamp_ms for m in ms), dtype=np.float64, count=len(ms))
            / 1000.0,
        )
        for key, ms in grouped.items()
    ]


# --- dataset inputs --------------------------------------------------------------------------

MAX_DATASETS_PER_BATCH = 1000
# MLflow's sizes (mlflow.utils.validation): name, digest, source, schema, profile; input tags.
DATASET_LIMITS = {
    "name": 500,
    "digest": 36,
    "source_type": 500,
    "source": 65535,
    "schema": 1048575,
    "profile": 16777215,
}
MAX_INPUT_TAG_KEY_SIZE = 255
MAX_INPUT_TAG_VALUE_SIZE = 500


def dataset_inputs_of(items: list[Any], *, path: str = "datasets") -> list[dict[str, Any]]:
    """`log_inputs`' datasets as MLflow's DatasetInput JSON, checked by MLflow's rules."""
    if len(items) > MAX_DATASETS_PER_BATCH:
        raise invalid(
            f"A batch logging request can contain at most {MAX_DATASETS_PER_BATCH} datasets. "
            f"Got {len(items)} datasets."
        )
    out = []
    for i, item in enumerate(items):
        where = f"{path}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("dataset"), dict):
            raise invalid_value(where, item, "must be an object with a 'dataset'")
        raw = item["dataset"]
        dataset: dict[str, str] = {}
        for name, limit in DATASET_LIMITS.items():
            required = name in ("name", "digest", "source_type", "source")
            value = string(raw, name, required=required, path=f"{where}.dataset.{name}")
            if len(value) > limit:
                raise too_long(f"{where}.dataset.{name}", limit)
            if value:
                dataset[name] = value
        tags = []
        for j, tag in enumerate(array(item, "tags")):
            tag_path = f"{where}.tags[{j}]"
            if not isinstance(tag, dict):
                raise invalid_value(tag_path, tag, "must be an object with 'key' and 'value'")
            key = string(tag, "key", required=True, path=f"{tag_path}.key")
            value = string(tag, "value", required=True, path=f"{tag_path}.value")
            if len(key) > MAX_INPUT_TAG_KEY_SIZE:
                raise too_long(f"{tag_path}.key", MAX_INPUT_TAG_KEY_SIZE)
            if len(value) > MAX_INPUT_TAG_VALUE_SIZE:
                raise too_long(f"{tag_path}.value", MAX_INPUT_TAG_VALUE_SIZE)
            tags.append({"key": key, "value": value})
        out.append({"tags": tags, "dataset": dataset})
    return out
