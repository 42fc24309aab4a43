"""MLflow's error shape: `{"error_code": "...", "message": "..."}` with MLflow's HTTP statuses.

The stock client turns this body into an `MlflowException` carrying the code, so a script sees
the same exception it would get from an MLflow server.
"""

from __future__ import annotations

from tracker.limits import echo

# The statuses MLflow's server gives each code (mlflow/exceptions.py). 5xx and 429 are retried
# by the client; a refusal of the request itself never is.
STATUS = {
    "INVALID_PARAMETER_VALUE": 400,
    "BAD_REQUEST": 400,
    "RESOURCE_ALREADY_EXISTS": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "RESOURCE_DOES_NOT_EXIST": 404,
    "ENDPOINT_NOT_FOUND": 404,
    "INTERNAL_ERROR": 500,
    "NOT_IMPLEMENTED": 501,
    "TEMPORARILY_UNAVAILABLE": 503,
}


class MlflowError(Exception):
    def __init__(
        self, message: str, code: str = "INVALID_PARAMETER_VALUE", *, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        # A status other than the code's own (413 for a file over the size limit).
        self._status = status

    @property
    def status(self) -> int:
        return self._status or STATUS.get(self.code, 500)

    def body(self) -> dict[str, str]:
        return {"error_code": self.code, "message": self.message}


def invalid(message: str) -> MlflowError:
    return MlflowError(message, "INVALID_PARAMETER_VALUE")


def missing(path: str) -> MlflowError:
    # MLflow's own wording (mlflow.utils.validation.missing_value), so scripts matching on it work.
    return invalid(f"Missing value for required parameter '{path}'.")


def not_found(message: str) -> MlflowError:
    return MlflowError(message, "RESOURCE_DOES_NOT_EXIST")


def run_not_found(run_id: str) -> MlflowError:
    return not_found(f"Run with id={echo(run_id)} not found")
