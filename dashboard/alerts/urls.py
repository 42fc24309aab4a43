from __future__ import annotations

from django.urls import path

from dashboard.alerts import views

# The alert pages keep their own URL namespace ("alerts:channels"), served from dashboard/.
app_name = "alerts"
urlpatterns = [
    path("projects/<slug:project>/alerts/", views.project_alerts, name="history"),
    path("projects/<slug:project>/alerts/channels/", views.channel_list, name="channels"),
    path(
        "projects/<slug:project>/alerts/channels/<int:channel_id>/",
        views.channel_edit,
        name="channel-edit",
    ),
    path(
        "projects/<slug:project>/alerts/channels/<int:channel_id>/delete/",
        views.channel_delete,
        name="channel-delete",
    ),
    path(
        "projects/<slug:project>/alerts/channels/<int:channel_id>/test/",
        views.channel_test,
        name="channel-test",
    ),
    path("projects/<slug:project>/alerts/rules/", views.rule_list, name="rules"),
    path("projects/<slug:project>/alerts/rules/<slug:kind>/", views.rule_edit, name="rule-edit"),
    path("runs/<slug:project>/<str:run_id>/alerts/", views.run_alerts, name="run-history"),
]
