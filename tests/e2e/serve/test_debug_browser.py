"""The debug UI in a real browser: headless Chromium (Debian's chromium and chromium-driver, `make
browser`) driven by selenium, with JavaScript turned off, against a running service that scored an
off-plan run sent by the real OpenTelemetry SDK exporter.

The operator's path: the partition list, filtered to failures with the page's own form; the row
of the run; its detail page, where the skipped step stands in the expected column with no observed
partner, the step run early is marked as moved, and the trace link points at the trace. The
screenshot is kept in the test's tmp dir (STEPWATCH_DOCS_SCREENSHOT=1 also writes docs/img/)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from shared_paths import REPO
from travel_run import OFF_PLAN, ON_PLAN, TRAVEL_EXPECTATIONS

pytestmark = pytest.mark.slow

TRACE_URL = "http://grafana.example:3000/explore?traceId={trace_id}"
MISSING_RED = "rgba(251, 227, 227, 1)"
"""The stylesheet's colour of an expected step deleted (tr.op-delete td.expected)."""


def tool(name: str) -> str:
    """A command of Debian's chromium packages; the test fails naming the set-up step without it."""
    found = shutil.which(name, path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if found is None:
        pytest.fail(
            f"`{name}` is not installed: run `make browser` (Debian's chromium, chromium-driver)",
            pytrace=False,
        )
    return found


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = tool("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1230"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    return webdriver.Chrome(service=DriverService(executable_path=tool("chromedriver")), options=options)


def walk(base: str, off_plan: str, screenshot: Path) -> dict[str, Any]:
    """In a thread (the service under test answers on the event loop): what the operator sees."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = browser()
    try:
        driver.get(f"{base}/debug/")
        driver.find_element(By.LINK_TEXT, "/debug/partitionz").click()
        form = driver.find_element(By.CSS_SELECTOR, "form.filters")
        Select(form.find_element(By.NAME, "outcome")).select_by_value("fail")
        form.find_element(By.NAME, "task_key").send_keys("book-trip")
        form.find_element(By.TAG_NAME, "button").click()  # a plain GET form: no JavaScript needed
        # click() returns before the new page has loaded: wait for the navigation it started
        WebDriverWait(driver, 10).until(lambda d: "outcome=" in d.current_url)
        listed_url = driver.current_url
        links = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "a.detail")]
        driver.find_element(By.LINK_TEXT, off_plan).click()
        WebDriverWait(driver, 10).until(lambda d: off_plan in d.current_url)
        rows = driver.find_elements(By.CSS_SELECTOR, "table.alignment tr")[1:]
        cells = [
            {
                "expected": row.find_element(By.CSS_SELECTOR, "td.expected").text,
                "observed": row.find_element(By.CSS_SELECTOR, "td.observed").text,
                "observed_class": row.find_element(By.CSS_SELECTOR, "td.observed").get_attribute("class"),
                "expected_colour": row.find_element(By.CSS_SELECTOR, "td.expected").value_of_css_property(
                    "background-color"
                ),
                "moved_tags": [t.text for t in row.find_elements(By.CSS_SELECTOR, ".tag.moved")],
            }
            for row in rows
        ]
        trace_links = [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "a.trace-link")]
        failed_rules = driver.find_element(
            By.XPATH, "//h2[text()='Failed rules']/following-sibling::table[1]"
        ).text
        driver.save_screenshot(str(screenshot))
        return {
            "listed_url": listed_url,
            "links": links,
            "detail_url": driver.current_url,
            "rows": cells,
            "trace_links": trace_links,
            "failed_rules": failed_rules,
        }
    finally:
        driver.quit()


async def test_an_operator_finds_the_missing_and_the_moved_step_in_a_browser(tmp_path, h, agent) -> None:
    tool("chromium")
    tool("chromedriver")
    pages = {"trace_url_template": TRACE_URL}
    async with h.running(tmp_path, TRAVEL_EXPECTATIONS, debug_pages=pages) as (service, _metrics):
        endpoint = f"127.0.0.1:{service.grpc.port}"
        runs = [{"task_key": "book-trip", "steps": OFF_PLAN}, {"task_key": "book-trip", "steps": ON_PLAN}]
        off, _on = await asyncio.to_thread(agent.send, "grpc", endpoint, runs)

        async def scored() -> bool:
            return len(service.debug.partitions.held()) == 2

        await h.eventually(scored, what="both runs scored")
        screenshot = tmp_path / "debug-partition.png"
        seen = await asyncio.to_thread(
            walk, f"http://127.0.0.1:{service.metrics_server.port}", off, screenshot
        )
    assert "outcome=fail" in seen["listed_url"] and "task_key=book-trip" in seen["listed_url"]
    assert seen["links"] == [off]  # the failure only, not the on-plan run
    assert seen["detail_url"].endswith(f"/debug/partitionz/trace/{off}?revision=0")
    rows = seen["rows"]
    (budget,) = [row for row in rows if row["expected"].startswith("check_budget")]
    assert budget["observed"] == "not performed" and "none" in budget["observed_class"].split()
    assert budget["expected_colour"] == MISSING_RED and not budget["moved_tags"]
    moved = [row for row in rows if "book_flight" in row["expected"] + row["observed"] and row["moved_tags"]]
    assert len(moved) == 2  # the expected place it was not run in, and the place it ran early
    assert seen["trace_links"] == [TRACE_URL.replace("{trace_id}", off)]
    assert "must_call: check_budget" in seen["failed_rules"]
    assert screenshot.stat().st_size > 10_000
    if os.environ.get("STEPWATCH_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(screenshot, REPO / "docs" / "img" / "debug-partition.png")
