from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator, validate_email

from alerts.kinds import BY_KEY
from alerts.models import Channel, Rule, Severity
from alerts.selectors import channel_list
from config.outbound import target_problem
from tracker.models import Project

_url = URLValidator(schemes=["http", "https"])
# The dispatcher subtracts the cooldown from a flag's time: a longer one overflows the date.
MAX_COOLDOWN = timedelta(days=365)


class ChannelForm(forms.Form):
    kind = forms.ChoiceField(choices=Channel.Kind.choices)
    name = forms.CharField(max_length=100)
    target = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Email: addresses, one per line. Slack: the incoming-webhook URL. "
        "Webhook: the endpoint URL.",
    )
    enabled = forms.BooleanField(required=False, initial=True)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind, target = data.get("kind"), (data.get("target") or "").strip()
        if kind == Channel.Kind.EMAIL:
            addresses = [a.strip() for a in target.replace(",", "\n").splitlines() if a.strip()]
            if not addresses:
                self.add_error("target", "at least one email address")
            for address in addresses:
                try:
                    validate_email(address)
                except ValidationError:
                    self.add_error("target", f"not an email address: {address}")
        elif kind:
            try:
                _url(target)
            except ValidationError:
                self.add_error("target", "an http(s) URL")
                return data
            # The same rule every request meets when it connects; here it is a clear error early.
            problem = target_problem(target)
            if problem:
                self.add_error("target", problem)
        return data


class RuleForm(forms.Form):
    severity = forms.ChoiceField(choices=Severity.choices)
    threshold = forms.FloatField(required=False)
    channels = forms.ModelMultipleChoiceField(
        queryset=Channel.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None selected: every enabled channel of the project.",
    )
    muted = forms.BooleanField(required=False)
    cooldown = forms.DurationField(help_text="HH:MM:SS; repeats within it are recorded, not sent.")

    def __init__(self, *args: Any, project: Project, rule: Rule, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        channels = self.fields["channels"]
        assert isinstance(channels, forms.ModelMultipleChoiceField)
        channels.queryset = channel_list(project=project)
        kind = BY_KEY.get(rule.kind)
        if kind is None or kind.passes is None:
            del self.fields["threshold"]
        else:
            self.fields["threshold"].help_text = kind.threshold_help

    def clean_cooldown(self) -> timedelta:
        value: timedelta = self.cleaned_data["cooldown"]
        if not timedelta(0) <= value <= MAX_COOLDOWN:
            raise ValidationError(f"must be from 0 to {MAX_COOLDOWN.days} days")
        return value

    def clean_threshold(self) -> float | None:
        value = self.cleaned_data.get("threshold")
        if value is not None and value < 0:
            raise ValidationError("must be zero or more")
        return value
