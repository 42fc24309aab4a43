"""MLflow's artifact proxy (`/api/2.0/mlflow-artifacts/...`), the endpoint the stock client's
`mlflow-artifacts:` URIs resolve to. Authenticated and answered as the tracking API is
(`tracker.mlflow.views`); the files are `tracker.mlflow.artifacts`' business."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from tracker import artifacts
from tracker.limits import echo
from tracker.mlflow import artifacts as mlflow_artifacts
from tracker.mlflow.errors import MlflowError
from tracker.mlflow.views import Data, authenticate, respond
from tracker.models import ApiToken

_MULTIPART = ("mpu/create/", "mpu/complete/", "mpu/abort/", "presigned/")
# The message MLflow's client reads as "multipart is not supported here" and then sends the
# file in one streamed PUT (mlflow.exceptions._UnsupportedMultipartUploadException).
MULTIPART_MESSAGE = "Multipart upload is not supported for the current artifact repository"


@csrf_exempt
def artifact_proxy(request: HttpRequest, path: str) -> HttpResponseBase:
    """MLflow's artifact proxy (`/api/2.0/mlflow-artifacts/...`): `artifacts?path=` lists a
    folder, `artifacts/<path>` takes PUT (upload, streamed), GET (download) and DELETE."""

    def handle() -> Data | HttpResponseBase:
        token = authenticate(request)
        method = request.method or ""
        if path.startswith(_MULTIPART):
            raise MlflowError(MULTIPART_MESSAGE, "NOT_IMPLEMENTED")
        if path.strip("/") == "artifacts" and method == "GET":
            place = mlflow_artifacts.place_of(
                project=token.project, path=request.GET.get("path", "")
            )
            files = mlflow_artifacts.files_json(mlflow_artifacts.artifact_list(place=place))
            return {"files": files} if files else {}
        if not path.startswith("artifacts/") or method not in ("GET", "PUT", "DELETE"):
            raise MlflowError(
                f"Runcast does not serve the MLflow artifact endpoint {echo(method)} "
                f"'{echo(path)}'. Supported: GET artifacts?path=, GET, PUT and DELETE "
                "artifacts/<path>.",
                "ENDPOINT_NOT_FOUND",
            )
        if method != "GET" and token.scope != ApiToken.Scope.WRITE:
            raise MlflowError(
                f"this token has the {token.scope!r} scope; uploading and deleting artifacts "
                "needs a write token",
                "PERMISSION_DENIED",
            )
        place = mlflow_artifacts.place_of(project=token.project, path=path[len("artifacts/") :])
        if method == "PUT":
            mlflow_artifacts.artifact_put(place=place, **_upload_body(request))
            return {}
        if method == "DELETE":
            mlflow_artifacts.artifact_delete(place=place)
            return {}
        return artifacts.file_response(mlflow_artifacts.artifact_open(place=place))

    return respond(handle)


def _upload_body(request: HttpRequest) -> dict[str, Any]:
    """The body to stream and its declared length. `requests` sends an empty file chunked
    (no Content-Length), and Django reads only CONTENT_LENGTH bytes: a server that dechunks
    (gunicorn says so with wsgi.input_terminated) is read to its end instead; elsewhere (the
    development server) a chunked upload is refused rather than stored empty."""
    length = _content_length(request)
    if length is not None:
        return {"body": request, "length": length}
    if request.META.get("wsgi.input_terminated"):
        return {"body": request.META["wsgi.input"], "length": None}
    raise MlflowError(
        "An artifact upload needs a Content-Length header on this server (a chunked body is "
        "read only behind gunicorn)",
        "INVALID_PARAMETER_VALUE",
        status=411,
    )


def _content_length(request: HttpRequest) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None
