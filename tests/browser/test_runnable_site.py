"""The website gives students the runnable edition: its download button serves chapters/runnable/."""

from __future__ import annotations

from urllib.parse import urljoin

import pytest
from site_pages import ROOT, notebook_for, toc_pages

NOTEBOOK_PAGES = [p for p in toc_pages() if notebook_for(p) is not None]


@pytest.mark.parametrize("name", NOTEBOOK_PAGES)
def test_download_button_gives_the_runnable_notebook(visit, name):
    report = visit(name)
    links = report.page.eval_on_selector_all(
        ".dropdown-download-buttons a[href]", "links => links.map(a => a.getAttribute('href'))")
    notebooks = [link for link in links if link.endswith(".ipynb")]
    assert len(notebooks) == 1, f"{name}: download links {links}"
    url = urljoin(report.url, notebooks[0])
    response = report.page.request.get(url)
    assert response.ok, f"{name}: {url} -> {response.status}"
    runnable = ROOT / "chapters" / "runnable" / notebook_for(name).name
    assert response.body() == runnable.read_bytes(), f"{name}: the download is not {runnable.relative_to(ROOT)}"
