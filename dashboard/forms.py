"""Input parsing for the run page: the plan forecasts use. Forms only validate and convert;
services write."""

from __future__ import annotations

from django import forms


class RunPlanForm(forms.Form):
    total_steps = forms.IntegerField(min_value=1, max_value=2**62, required=False)
    deadline = forms.SlugField(required=False)
