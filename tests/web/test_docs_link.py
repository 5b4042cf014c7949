"""The pages' "Docs" link opens the documentation site's page about the dashboard, under a base
URL the operator chooses (dex.web.docs_link); nothing but a path or an http(s) URL is taken."""

from __future__ import annotations

from typing import Any

import pytest

import dex
from dex.adapters.memory import InMemoryAdapter
from dex.cli.web import web as web_command
from dex.testing import VirtualClock
from dex.web import create_app
from dex.web.docs_link import DASHBOARD_PAGE, DEFAULT_DOCS_URL
from tests.cli.conftest import invoke, one_line_error
from tests.web.conftest import client


@pytest.fixture
def engine() -> dex.Engine:
    return dex.Engine(InMemoryAdapter(clock=VirtualClock()))


def docs_hrefs(page: str) -> list[str]:
    return [part.split('"', 1)[0] for part in page.split('<a href="')[1:] if 'rel="help"' in part.split(">", 1)[0]]


def test_by_default_the_link_is_the_dashboards_page_under_docs_on_this_host(engine: dex.Engine) -> None:
    with client(create_app(engine)) as http:
        for path in ("/", "/runs", "/queues", "/no-such-page"):
            assert docs_hrefs(http.get(path).text) == ["/docs/how-to/web-dashboard/"], path
    assert DEFAULT_DOCS_URL + DASHBOARD_PAGE == "/docs/how-to/web-dashboard/"


@pytest.mark.parametrize(
    ("docs_url", "link"),
    [
        ("https://docs.example.com/dex/", "https://docs.example.com/dex/how-to/web-dashboard/"),
        ("https://docs.example.com/dex", "https://docs.example.com/dex/how-to/web-dashboard/"),
        ("/manuals/dex/", "/manuals/dex/how-to/web-dashboard/"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000/how-to/web-dashboard/"),
    ],
)
def test_a_base_url_given_is_where_the_link_goes(engine: dex.Engine, docs_url: str, link: str) -> None:
    with client(create_app(engine, docs_url=docs_url)) as http:
        assert docs_hrefs(http.get("/").text) == [link]


@pytest.mark.parametrize(
    "docs_url",
    ["javascript:alert(1)", "", "docs/", "//evil.example/", "/a b", '/x"onclick="y', "/x<y", "ftp://x/", 5, None],
)
def test_anything_but_a_path_or_an_http_url_is_refused(engine: dex.Engine, docs_url: Any) -> None:
    with pytest.raises(ValueError, match="docs_url"):
        create_app(engine, docs_url=docs_url)


def test_dex_web_takes_the_base_url_and_refuses_a_bad_one_in_one_line() -> None:
    option = next(p for p in web_command.params if p.name == "docs_url")
    assert option.default == DEFAULT_DOCS_URL
    assert option.envvar == "DEX_DOCS_URL"
    result = invoke("web", "--docs-url", "javascript:alert(1)", env={"DEX_DATABASE_URL": "postgresql://nowhere/x"})
    assert result.exit_code == 2, result.output
    assert "--docs-url" in one_line_error(result)


def test_without_a_built_site_the_default_link_opens_a_page_that_says_how_to_get_one(engine: dex.Engine) -> None:
    with client(create_app(engine)) as http:
        page = http.get("/docs/how-to/web-dashboard/")
    assert page.status_code == 200
    assert 'id="docs-missing"' in page.text and "mkdocs build" in page.text and "--docs-dir" in page.text


def test_a_built_site_is_served_under_docs(engine: dex.Engine, tmp_path: Any) -> None:
    (tmp_path / "how-to" / "web-dashboard").mkdir(parents=True)
    (tmp_path / "index.html").write_text("<h1>dex docs</h1>")
    (tmp_path / "how-to" / "web-dashboard" / "index.html").write_text("<h1>The dashboard</h1>")
    with client(create_app(engine, docs_dir=tmp_path)) as http:
        assert "The dashboard" in http.get(docs_hrefs(http.get("/").text)[0]).text
        assert http.get("/docs/no-such-page/").status_code == 404


def test_a_docs_dir_that_holds_no_site_is_refused(engine: dex.Engine, tmp_path: Any) -> None:
    with pytest.raises(ValueError, match=r"no index\.html"):
        create_app(engine, docs_dir=tmp_path)
    result = invoke("web", "--docs-dir", str(tmp_path), env={"DEX_DATABASE_URL": "postgresql://nowhere/x"})
    assert result.exit_code == 2
    assert "no built site" in one_line_error(result)
