"""Login throttling: after RUNCAST_LOGIN_MAX_FAILURES wrong passwords for one username from one
client address, that pair is locked out for RUNCAST_LOGIN_LOCKOUT_S.

The count lives in the cache (Redis in production, so every web worker shares it). The check sits
in the authentication backend, so the admin's login form is throttled as well as ours; our
login page also answers 429 with Retry-After while locked. Counting per username *and*
address means a stranger guessing from elsewhere cannot lock a user out of their own address.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse


def _key(request: HttpRequest | None, username: str | None) -> str:
    address = request.META.get("REMOTE_ADDR", "") if request is not None else ""
    # Hashed: usernames and addresses stay out of cache keys (and Redis dumps).
    digest = hashlib.sha256(f"{(username or '').strip().lower()}|{address}".encode()).hexdigest()
    return f"login-failures:{digest}"


def _limit() -> int:
    return int(settings.RUNCAST_LOGIN_MAX_FAILURES)


def lockout_s() -> int:
    return int(settings.RUNCAST_LOGIN_LOCKOUT_S)


def is_locked(request: HttpRequest | None, username: str | None) -> bool:
    return int(cache.get(_key(request, username), 0)) >= _limit()


def failure_record(request: HttpRequest | None, username: str | None) -> None:
    key = _key(request, username)
    # add() then incr(): atomic on Redis, so concurrent guesses are all counted. The window
    # starts at the first failure; failures while locked do not extend it.
    if not cache.add(key, 1, timeout=lockout_s()):
        try:
            cache.incr(key)
        except ValueError:  # expired between add() and incr()
            cache.add(key, 1, timeout=lockout_s())


def failures_clear(request: HttpRequest | None, username: str | None) -> None:
    cache.delete(_key(request, username))


class ThrottledModelBackend(ModelBackend):
    """Django's username/password check, refused outright while the pair is locked out."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        if username is None or password is None:
            return None
        if is_locked(request, username):
            # PermissionDenied stops every backend: no password is checked while locked.
            raise PermissionDenied("too many failed logins")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            failure_record(request, username)
        else:
            failures_clear(request, username)
        return user


class LoginView(auth_views.LoginView):
    """Django's login page, answering 429 (with Retry-After) while the pair is locked out."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        username = request.POST.get("username", "")
        if is_locked(request, username):
            return self._locked()
        response = super().post(request, *args, **kwargs)
        if response.status_code == 200 and is_locked(request, username):
            return self._locked()  # this failure was the last one allowed
        return response

    def _locked(self) -> HttpResponse:
        minutes = max(1, round(lockout_s() / 60))
        # An empty form: a bound one would run authenticate() again just to show its errors.
        context = self.get_context_data(form=self.get_form_class()(), locked_minutes=minutes)
        response = self.render_to_response(context, status=429)
        response["Retry-After"] = str(lockout_s())
        return response
