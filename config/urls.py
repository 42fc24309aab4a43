from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from config.api import api
from config.views import healthz
from dashboard.login import LoginView

# /api/v1/ and /healthz answer JSON for an error no view handled; pages keep the HTML page.
handler500 = "config.errors.server_error"

urlpatterns = [
    path("api/v1/", api.urls),
    # The MLflow tracking REST API, so stock MLflow clients log here (docs/mlflow.md).
    path("", include("tracker.mlflow.urls")),
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("login/", LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "account/password/",
        auth_views.PasswordChangeView.as_view(),
        name="password_change",
    ),
    path(
        "account/password/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("", include("dashboard.alerts.urls")),
    path("", include("dashboard.urls")),
]
