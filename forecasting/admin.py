"""Forecasts, flags, the hysteresis' readings and the server clock, for operators to inspect:
all written by the forecasting services (a flag is the alerts' outbox), so read-only."""

from __future__ import annotations

from django.contrib import admin

from forecasting.models import ConditionReading, Flag, Forecast, SeriesSample, ServerClock
from tracker.admin import ReadOnlyAdmin


@admin.register(Forecast)
class ForecastAdmin(ReadOnlyAdmin):
    list_display = ("run", "kind", "computed_at", "segment", "input_last_step", "finish_p50")
    list_filter = ("kind",)
    search_fields = ("run__public_id",)
    date_hierarchy = "computed_at"
    list_select_related = ("run",)
    show_full_result_count = False  # one row per run per 15 s: counting them all is slow


@admin.register(Flag)
class FlagAdmin(ReadOnlyAdmin):
    list_display = (
        "run",
        "kind",
        "state",
        "previous_state",
        "severity",
        "created_at",
        "processed_at",
    )
    list_filter = ("kind", "state")
    search_fields = ("run__public_id", "explanation")
    date_hierarchy = "created_at"
    list_select_related = ("run",)


@admin.register(ConditionReading)
class ConditionReadingAdmin(ReadOnlyAdmin):
    list_display = ("run", "computed_at", "segment", "found", "deadline_p", "input_step")
    search_fields = ("run__public_id",)
    date_hierarchy = "computed_at"
    list_select_related = ("run",)
    show_full_result_count = False  # one row per run per computation


@admin.register(SeriesSample)
class SeriesSampleAdmin(ReadOnlyAdmin):
    list_display = ("run", "key", "limit", "points", "stride", "updated_at")
    search_fields = ("run__public_id", "key")
    list_select_related = ("run",)
    # The packed arrays are binary: the cursor and counts say what a row covers.
    fields = (
        "run",
        "key",
        "limit",
        "keep_nonfinite",
        "stride",
        "points",
        "cursor_segment",
        "cursor_min_step",
        "cursor_chunk",
        "firsts",
        "updated_at",
    )


@admin.register(ServerClock)
class ServerClockAdmin(ReadOnlyAdmin):
    list_display = ("listening_since", "last_tick_at")
