"""Input parsing for projects and people: a new project, an invitation, an account with a
password, and the invitation link's own form. Forms only validate and convert; services write."""

from __future__ import annotations

from django import forms

from dashboard.project_settings.forms import timezone_choices
from tracker.models import Membership


class ProjectCreateForm(forms.Form):
    name = forms.CharField(max_length=200)
    slug = forms.SlugField(
        max_length=64,
        required=False,
        help_text="In URLs and runcast.init(project=…); from the name if blank.",
    )
    timezone = forms.ChoiceField(choices=timezone_choices, initial="UTC")
    gpu_hour_price = forms.DecimalField(
        required=False, min_value=0, max_digits=10, decimal_places=4, label="GPU-hour price"
    )
    currency = forms.RegexField(regex=r"^[A-Za-z]{3}$", max_length=3, initial="USD")


class InviteForm(forms.Form):
    email = forms.EmailField(max_length=254)
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)


class AccountCreateForm(forms.Form):
    username = forms.CharField(max_length=150)
    email = forms.EmailField(max_length=254, required=False)
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)


class InviteAcceptForm(forms.Form):
    username = forms.CharField(
        max_length=150, widget=forms.TextInput(attrs={"autocomplete": "username"})
    )
    password = forms.CharField(
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}), max_length=128
    )
    password_again = forms.CharField(
        widget=forms.PasswordInput(attrs={"autocomplete": "new-password"}), max_length=128
    )

    def clean(self) -> dict[str, object]:
        data = super().clean() or {}
        if data.get("password") != data.get("password_again"):
            self.add_error("password_again", "the two passwords differ")
        return data
