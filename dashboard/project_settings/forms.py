"""Input parsing for the project settings page: the project, targets, members, tokens and
deadlines. Forms only validate and convert; services write."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import cache
from zoneinfo import available_timezones

from django import forms

from tracker.models import ApiToken, Deadline, Membership
from tracker.project_settings.services import MAX_BUFFER, local_to_aware, parse_targets
from tracker.services import ServiceError


@cache
def timezone_choices() -> list[tuple[str, str]]:
    return [(z, z) for z in sorted(available_timezones()) if "/" in z or z == "UTC"]


class ProjectForm(forms.Form):
    gpu_hour_price = forms.DecimalField(
        required=False, min_value=0, max_digits=10, decimal_places=4, label="GPU-hour price"
    )
    currency = forms.RegexField(regex=r"^[A-Za-z]{3}$", max_length=3, initial="USD")
    timezone = forms.ChoiceField(choices=timezone_choices)


class TargetsForm(forms.Form):
    targets = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 4, "placeholder": "val_loss = 3.28"}),
        help_text="One per line: metric key = target value.",
    )

    def clean_targets(self) -> dict[str, float]:
        raw: dict[str, str] = {}
        for n, line in enumerate(self.cleaned_data["targets"].splitlines(), start=1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                raise forms.ValidationError(f"line {n}: write it as key = value")
            raw[key.strip()] = value.strip()
        try:
            return parse_targets(raw)
        except ServiceError as exc:
            raise forms.ValidationError(f"{exc.field}: {exc.message}") from exc

    @staticmethod
    def initial_text(targets: dict[str, float]) -> str:
        return "\n".join(f"{k} = {v:g}" for k, v in sorted(targets.items()))


class MemberAddForm(forms.Form):
    user = forms.CharField(max_length=150, label="Username or email")
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)


class MemberRoleForm(forms.Form):
    role = forms.ChoiceField(choices=Membership.Role.choices, required=False)
    remove = forms.BooleanField(required=False)


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100)
    scope = forms.ChoiceField(choices=ApiToken.Scope.choices, initial=ApiToken.Scope.WRITE)


class DeadlineForm(forms.Form):
    name = forms.CharField(max_length=200)
    cutoff_local = forms.DateTimeField(
        label="Cutoff (wall clock in its timezone)",
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    timezone = forms.ChoiceField(choices=timezone_choices, help_text="As announced (IANA name).")
    buffer_hours = forms.FloatField(
        min_value=0,
        # Also keeps timedelta() below from overflowing; the service checks the same bound.
        max_value=MAX_BUFFER.total_seconds() / 3600,
        initial=0,
        label="Buffer (hours)",
        help_text="Work after training: eval…",
    )
    notes = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        local = data.get("cutoff_local")
        zone = data.get("timezone")
        if isinstance(local, datetime) and isinstance(zone, str):
            # The browser sends a naive wall-clock time: it means that time in the chosen zone.
            data["cutoff"] = local_to_aware(local=local.replace(tzinfo=None), timezone=zone)
        data["buffer"] = timedelta(hours=float(data.get("buffer_hours") or 0))
        return data

    @classmethod
    def initial_for(cls, deadline: Deadline) -> dict[str, object]:
        local = deadline.cutoff.astimezone(_zone(deadline.timezone)).replace(tzinfo=None)
        return {
            "name": deadline.name,
            "cutoff_local": local,
            "timezone": deadline.timezone,
            "buffer_hours": deadline.buffer.total_seconds() / 3600,
            "notes": deadline.notes,
        }


def _zone(name: str):  # type: ignore[no-untyped-def]
    from zoneinfo import ZoneInfo

    return ZoneInfo(name)


class MirrorForm(forms.Form):
    url = forms.CharField(
        max_length=500,
        label="MLflow server",
        widget=forms.TextInput(attrs={"placeholder": "https://mlflow.example.com"}),
    )
    experiment_name = forms.CharField(
        max_length=500, required=False, label="Experiment", help_text="Blank: every experiment."
    )
    # Never rendered back: a blank field keeps the stored token. "new-password": browsers ignore
    # "off" on a password field and would fill in the user's Runcast password, which a save
    # would then send to the MLflow server.
    token = forms.CharField(
        max_length=1000,
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Sent as Authorization: Bearer. Blank keeps the one stored.",
    )
    username = forms.CharField(
        max_length=150,
        required=False,
        help_text="For MLflow's basic auth: the token is then its password. Blank: a bearer token.",
    )
    clear_token = forms.BooleanField(required=False, label="Remove the stored token")
    enabled = forms.BooleanField(required=False, initial=True)
