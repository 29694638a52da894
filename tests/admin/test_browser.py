"""One real browser: Debian's chromium, headless, through selenium and the system chromedriver.

Logs in, opens the overview, opens a queue and a message, delivers messages now and reschedules
one through the confirmation page, and saves a screenshot of each page under
``artifacts/screenshots/<vendor>/`` (``SQ_ARTIFACTS_DIR`` moves ``artifacts``). Skipped when
chromium is missing, unless ``SQ_REQUIRE_BROWSER=1`` (CI), where a missing browser fails.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from spanner_queues import api
from spanner_queues.monitoring import QueueDepthSample
from tests.testapp.models import Emails, EmailsDead, Jobs

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("SQ_ARTIFACTS_DIR", ROOT / "artifacts"))


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    chromium = _chromium()
    if not (chromium and CHROMEDRIVER.is_file()):
        reason = (
            "Debian chromium and chromium-driver are not installed (/usr/bin/chromedriver is "
            "missing); bin/test installs them when run as root: apt-get install -y chromium "
            "chromium-driver"
        )
        if os.environ.get("SQ_REQUIRE_BROWSER"):
            pytest.fail(reason)
        pytest.skip(reason)
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _seed() -> None:
    """A backlog that grew over the last half hour, and messages in every state."""
    now = timezone.now()
    for i, depth in enumerate([0, 0, 1, 1, 2, 3, 3, 4, 5, 6]):
        QueueDepthSample.objects.create(
            queue="testapp.Jobs",
            measured_at=now - timedelta(minutes=30 - 3 * i),
            total=depth,
            ready=max(depth - 1, 0),
            scheduled=min(depth, 1),
            leased=0,
        )
    Jobs.send_many(
        [{"id": f"job-{i:02d}", "payload": {"order": i, "note": "<b>inert</b>"}} for i in range(6)]
    )
    Jobs.send(id="job-later", payload="plain text", delay=timedelta(hours=2))
    # a long payload without spaces, held by a receiver: a lease expiry to show (issue 23: at
    # 1400 px the table hid Lease expires and Payload behind a scrollbar)
    long = {"order": 99, "url": "https://example.com/" + "x" * 40 + "/report.csv", "n": 1}
    Jobs.send(id="job-with-a-longer-key-0001", payload=long)
    api.receive(Jobs)  # one in flight: its lease expiry shows
    Emails.send(id="welcome", payload={"to": "ada@example.com"})


def test_operator_delivers_a_message_now(
    browser: Any, live_server: Any, django_user_model: Any
) -> None:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    django_user_model.objects.create_superuser("admin", "admin@example.com", "secret-pw")
    _seed()
    shots = ARTIFACTS / "screenshots" / connection.vendor
    shots.mkdir(parents=True, exist_ok=True)
    wait = WebDriverWait(browser, 30)

    def shot(name: str) -> None:
        assert browser.save_screenshot(str(shots / f"{name}.png"))

    def click(by: str, value: str) -> None:
        old = browser.find_element(By.TAG_NAME, "html")
        browser.find_element(by, value).click()
        # (Chrome may answer a look at the old page's node, mid-navigation, with an inspector
        # error rather than "stale": both mean the old page is going.)
        WebDriverWait(browser, 30, ignored_exceptions=[WebDriverException]).until(
            ec.staleness_of(old)
        )

    def every_column_in_view() -> None:
        """At 1400 px every column of the page's table is in view: no scrollbar hides any.

        Measured in one script: the overview swaps its table while it refreshes itself, so a
        node found by one call may be gone by the next."""
        overflow, width, edges = browser.execute_script(
            """const results = document.querySelector("#changelist .results");
            return [results.scrollWidth - results.clientWidth,
                    document.documentElement.clientWidth,
                    Array.from(document.querySelectorAll("#result_list thead th"),
                               th => [th.textContent.trim(), th.getBoundingClientRect().right])];"""
        )
        assert overflow <= 0, f"the table scrolls sideways by {overflow}px"
        assert edges
        for text, edge in edges:
            assert edge <= width, f"{text!r} ends at {edge}px of {width}px"

    browser.get(f"{live_server.url}/admin/login/?next=/admin/")
    browser.find_element(By.ID, "id_username").send_keys("admin")
    browser.find_element(By.ID, "id_password").send_keys("secret-pw")
    shot("01-login")
    click(By.CSS_SELECTOR, "input[type=submit]")
    shot("02-admin-index")

    click(By.CSS_SELECTOR, "a[href='/admin/spanner_queues/queues/']")

    def jobs_row() -> tuple[str, int]:
        """The Jobs row's total and its chart's lines, read in one script (see above)."""
        total, lines = browser.execute_script(
            """const row = document.querySelector("tr[data-queue='testapp.Jobs']");
            return [row.querySelector(".sq-total").textContent.trim(),
                    row.querySelectorAll("svg polyline").length];"""
        )
        return total, lines

    total, lines = jobs_row()
    assert total == "8"
    assert lines  # the depth chart
    shot("03-overview")
    every_column_in_view()
    # The overview refreshes itself (no reload: the page stays, its counts change) ...
    page = browser.find_element(By.TAG_NAME, "html")
    toggle = browser.find_element(By.ID, "sq-refresh-toggle")
    assert toggle.is_displayed() and toggle.text == "Pause"
    Jobs.send(id="job-new", payload="new")
    WebDriverWait(browser, 60).until(lambda b: jobs_row()[0] == "9")
    assert page.is_displayed()  # the same document: not reloaded
    # ... until paused; the choice is kept for the next visit.
    toggle.click()
    assert toggle.text == "Resume"
    assert browser.find_element(By.ID, "sq-refresh-status").text == "Refresh paused."
    assert (
        browser.execute_script("return localStorage.getItem('spanner_queues.overview.paused');")
        == "1"
    )
    browser.refresh()
    assert browser.find_element(By.ID, "sq-refresh-toggle").text == "Resume"
    # (left paused: a link clicked while the part it is in is swapped would be stale)

    click(By.LINK_TEXT, "testapp.Jobs")
    assert "Messages in testapp.Jobs" in browser.title
    shot("04-queue")
    every_column_in_view()

    click(By.PARTIAL_LINK_TEXT, "id=job-later")
    assert "plain text" in browser.find_element(By.ID, "sq-payload").text
    shot("05-message")
    browser.back()
    wait.until(ec.presence_of_element_located((By.ID, "result_list")))

    for key in ("job-later", "job-00"):
        browser.find_element(By.CSS_SELECTOR, f"input.action-select[value='{key}']").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("deliver_now")
    click(By.CSS_SELECTOR, "button[name=index]")
    assert "Are you sure" in browser.find_element(By.ID, "content").text
    shot("06-confirm")

    click(By.CSS_SELECTOR, "input[type=submit][value^='Yes']")
    note = browser.find_element(By.CSS_SELECTOR, "ul.messagelist li.success").text
    assert note == "Delivered now (acked and sent again): 2 messages of testapp.Jobs."
    shot("07-done")
    assert Jobs.objects.get(id="job-later").deliver_time <= timezone.now()

    # Reschedule through the browser's own datetime-local input (prefilled: in an hour).
    browser.find_element(By.CSS_SELECTOR, "input.action-select[value='job-01']").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("reschedule")
    click(By.CSS_SELECTOR, "button[name=index]")
    assert browser.find_element(By.ID, "id_deliver_time").get_attribute("type") == "datetime-local"
    shot("08-reschedule")
    click(By.CSS_SELECTOR, "input[type=submit][value^='Yes']")
    assert browser.find_element(By.CSS_SELECTOR, "ul.messagelist li.success").text.startswith(
        "Rescheduled to "
    )
    later = Jobs.objects.get(id="job-01").deliver_time - timezone.now()
    assert timedelta(minutes=50) < later <= timedelta(hours=1)


def test_operator_moves_all_matching_dead_letters_back_in_parts(
    browser: Any, live_server: Any, django_user_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bulk action on a filter, end to end: the filter panel, the preview count, the
    confirmation, two parts (the progress page posts the next one by itself), the result."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    monkeypatch.setattr("spanner_queues.admin.views.BULK_PER_REQUEST", 2)  # (the server thread)
    django_user_model.objects.create_superuser("admin", "admin@example.com", "secret-pw")
    EmailsDead.send_many(
        [{"id": f"dead-{i}", "payload": {"error": "carrier timeout"}} for i in range(3)]
        + [{"id": "dead-other", "payload": {"error": "bad address"}}, {"id": "kept", "payload": {}}]
    )
    shots = ARTIFACTS / "screenshots" / connection.vendor
    shots.mkdir(parents=True, exist_ok=True)
    wait = WebDriverWait(browser, 30, ignored_exceptions=[WebDriverException])

    browser.get(
        f"{live_server.url}/admin/login/?next=/admin/spanner_queues/queues/testapp.emailsdead/"
    )
    browser.find_element(By.ID, "id_username").send_keys("admin")
    browser.find_element(By.ID, "id_password").send_keys("secret-pw")
    old = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(ec.staleness_of(old))

    browser.find_element(By.CSS_SELECTOR, "#sq-bulk-filter summary").click()
    browser.find_element(By.CSS_SELECTOR, "input[name='prefix.id']").send_keys("dead-")
    browser.find_element(By.CSS_SELECTOR, "input[name='text']").send_keys("timeout")
    Select(browser.find_element(By.NAME, "operation")).select_by_value("move")
    assert browser.save_screenshot(str(shots / "09-bulk-filter.png"))
    old = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.CSS_SELECTOR, "#sq-bulk-filter input[type=submit]").click()
    wait.until(ec.staleness_of(old))
    preview = browser.find_element(By.ID, "sq-bulk-preview").text
    assert preview.startswith("3 messages of testapp.EmailsDead match"), preview
    assert Select(browser.find_element(By.NAME, "to")).first_selected_option.text == (
        "testapp.Emails"
    )
    assert browser.save_screenshot(str(shots / "10-bulk-confirm.png"))

    browser.find_element(By.CSS_SELECTOR, "input[type=submit][value^='Yes']").click()
    note = wait.until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "ul.messagelist li.success"))
    )
    assert note.text == (
        "Bulk move to testapp.Emails on id starts with 'dead-', payload contains 'timeout' in "
        "testapp.EmailsDead: 3 done, 0 skipped (leased or changed since read)."
    )
    assert browser.save_screenshot(str(shots / "11-bulk-done.png"))
    assert sorted(Emails.objects.values_list("id", flat=True)) == ["dead-0", "dead-1", "dead-2"]
    assert sorted(EmailsDead.objects.values_list("id", flat=True)) == ["dead-other", "kept"]
