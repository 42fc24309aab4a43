from __future__ import annotations

from django.urls import path

from dashboard import views

app_name = "dashboard"
urlpatterns = [
    path("", views.home, name="home"),
    path("runs/<slug:project>/<str:run_id>/", views.run_detail, name="run"),
    path("runs/<slug:project>/<str:run_id>/series.json", views.run_series, name="run-series"),
]
