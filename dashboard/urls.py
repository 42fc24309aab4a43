from __future__ import annotations

from django.urls import path

from dashboard import views
from dashboard.explorer import views as explorer_views
from dashboard.gpu import views as gpu_views
from dashboard.project_settings import views as settings_views
from dashboard.team import views as team_views

app_name = "dashboard"
run = "runs/<slug:project>/<str:run_id>/"
settings = "projects/<slug:project>/settings/"
urlpatterns = [
    path("", views.home, name="home"),
    path("board/", views.board_partial, name="board-partial"),
    path(run, views.run_detail, name="run"),
    path(f"{run}summary/", views.run_summary, name="run-summary"),
    path(f"{run}plan/", views.run_plan, name="run-plan"),
    path(f"{run}series.json", views.run_series, name="run-series"),
    path(f"{run}throughput.json", views.run_throughput, name="run-throughput"),
    path(f"{run}overview.json", views.run_overview, name="run-overview"),
    path(f"{run}ranks.json", views.run_ranks, name="run-ranks"),
    path(f"{run}files/<path:path>", views.run_file, name="run-file"),
    path("projects/<slug:project>/compare/", views.compare, name="compare"),
    path("projects/<slug:project>/runs/", explorer_views.runs_page, name="runs"),
    path("projects/<slug:project>/runs.csv", explorer_views.runs_csv, name="runs-csv"),
    path("projects/<slug:project>/runs/views/", explorer_views.view_save, name="view-save"),
    path("projects/<slug:project>/runs/bulk/", explorer_views.runs_bulk, name="runs-bulk"),
    path(
        "projects/<slug:project>/runs/views/<int:view_id>/delete/",
        explorer_views.view_delete,
        name="view-delete",
    ),
    path("projects/<slug:project>/deadlines/", explorer_views.deadlines_page, name="deadlines"),
    path("runs/", explorer_views.runs_page, name="runs-all"),
    path("runs.csv", explorer_views.runs_csv, name="runs-all-csv"),
    path("hosts/<slug:project>/<str:host>/", gpu_views.host_page, name="host"),
    path(settings, settings_views.settings_page, name="settings"),
    path(f"{settings}project/", settings_views.settings_project, name="settings-project"),
    path(f"{settings}mlflow-mirror/", settings_views.settings_mirror, name="settings-mirror"),
    path(f"{settings}targets/", settings_views.settings_targets, name="settings-targets"),
    path(f"{settings}members/", settings_views.member_add, name="member-add"),
    path(
        f"{settings}members/<int:membership_id>/",
        settings_views.member_update,
        name="member-update",
    ),
    path("projects/new/", team_views.project_new, name="project-new"),
    path(f"{settings}invitations/", team_views.member_invite, name="member-invite"),
    path(f"{settings}accounts/", team_views.member_create, name="member-create"),
    path(
        f"{settings}invitations/<int:invitation_id>/revoke/",
        team_views.invitation_revoke,
        name="invitation-revoke",
    ),
    path("invite/<str:token>/", team_views.invite_accept, name="invite-accept"),
    path(f"{settings}tokens/", settings_views.token_new, name="token-new"),
    path(
        f"{settings}tokens/<int:token_id>/revoke/", settings_views.token_delete, name="token-revoke"
    ),
    path(
        "projects/<slug:project>/deadlines/new/", settings_views.deadline_new, name="deadline-new"
    ),
    path(
        "projects/<slug:project>/deadlines/<slug:slug>/",
        settings_views.deadline_edit,
        name="deadline-edit",
    ),
]
