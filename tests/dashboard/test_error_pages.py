"""A page that refuses or finds nothing says why in the app's frame, not Django's bare text."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.test import Client

from tracker.models import Project


def test_a_missing_host_says_what_is_missing_and_how_to_get_it(
    client: Client, member: User, project: Project
) -> None:
    client.force_login(member)
    response = client.get("/hosts/llm/gpu-7/")
    html = response.content.decode()
    assert response.status_code == 404
    assert "No host &#x27;gpu-7&#x27; in this project (start the agent to register it)." in html
    assert 'href="/"' in html and "Runcast" in html  # the app's own header and a way back


def test_an_outsider_learns_nothing_about_the_project(
    client: Client, outsider: User, project: Project
) -> None:
    client.force_login(outsider)
    html = client.get("/hosts/llm/gpu-7/").content.decode()
    assert "No such project." in html and "gpu-7" not in html.split("<main>")[1]


def test_a_url_that_matches_no_page_names_the_path(client: Client, member: User) -> None:
    client.force_login(member)
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    assert "No page at /no/such/page/." in response.content.decode()


def test_a_refusal_names_the_role_it_needs(client: Client, viewer: User, project: Project) -> None:
    client.force_login(viewer)
    response = client.post("/projects/llm/settings/targets/", {"targets": "loss = 3.2"})
    assert response.status_code == 403
    assert "Needs the member role." in response.content.decode()
