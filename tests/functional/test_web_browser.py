"""The web view in a real browser: headless Chromium, driven by Selenium, against the real
application served by uvicorn on a loopback port over a real SQLite database.

Screenshots of each page land in tests/artifacts/ (not kept in git)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.functional.test_api_helpers import free_port, make_container
from tests.functional.web_support import (DEDICATED, HOSTILE, SHARED, Known, big_host, record_guests, store_plan,
                                          store_profiles)
from tests.support import require
from vmplacer.config import EXAMPLE_CAPABILITIES, EXAMPLE_HOST_NAME
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.web.security import CSP

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
BIG = "big-512"
WAIT_S = 30.0


@dataclass
class Site:
    url: str
    read: str
    known: Known
    container: Any


def _serve(app: Any, port: int) -> tuple[Any, threading.Thread]:
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="web-view-server", daemon=True)
    thread.start()
    for _ in range(600):  # until it listens; bounded by the server thread, not a clock
        if server.started or not thread.is_alive():
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    return server, thread


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    require(bool(shutil.which("chromium") and shutil.which("chromedriver")),
            "chromium and chromedriver are not installed (scripts/setup.sh installs them)")
    from vmplacer.adapters.db.api import SqlTokenStore
    from vmplacer.api.app import create_app
    from vmplacer.api.services import ApiOptions

    directory = tmp_path_factory.mktemp("web")
    hosts = [{"name": EXAMPLE_HOST_NAME, "uri": "test:///default", "capabilities": str(EXAMPLE_CAPABILITIES)},
             {"name": BIG, "uri": "test:///default", "capabilities": str(big_host(directory))}]
    container = make_container(f"sqlite:///{directory / 'vmplacer.db'}", directory, hosts)
    read = SqlTokenStore(container.sessions).create("viewer", "read")
    known = record_guests(container, EXAMPLE_HOST_NAME)
    store_plan(container, EXAMPLE_HOST_NAME)
    store_profiles(container, EXAMPLE_HOST_NAME)
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0))
    port = free_port()
    server, thread = _serve(app, port)
    app.state.services.check_isolation()  # what `serve` does every minute: the pages show its counts
    try:
        yield Site(f"http://127.0.0.1:{port}", read, known, container)
    finally:
        server.should_exit = True
        thread.join(30)
        container.close()


@pytest.fixture(scope="module")
def browser(site: Site) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1440,1000", "--no-first-run", "--disable-extensions"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                              options=options)
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, condition: Any) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S).until(condition)


def _sign_in(driver: Any, site: Site, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(f"{site.url}/ui/login")
    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.ID, "sign-in").click()
    # the form's answer: the fleet page, or the login page again with its message
    _wait(driver, lambda d: d.current_url == f"{site.url}/ui/" or d.find_elements(By.ID, "login-error"))


def _shot(driver: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1440, max(800, min(int(height) + 40, 4000)))
    driver.save_screenshot(str(ARTIFACTS / f"web-{name}.png"))
    driver.set_window_size(1440, 1000)


def _console(driver: Any) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser")]


def _no_alert(driver: Any) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def test_without_a_cookie_the_browser_lands_on_the_login_page(site, browser):
    browser.delete_all_cookies()
    browser.get(f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    assert browser.current_url == f"{site.url}/ui/login"
    assert browser.find_element("id", "token").get_attribute("type") == "password"
    _shot(browser, "login")


def test_a_bad_token_is_refused_with_a_message(site, browser):
    _sign_in(browser, site, "vmp_not-a-token")
    assert browser.current_url == f"{site.url}/ui/login"
    assert browser.find_element("id", "login-error").text == "unknown or revoked token"
    assert browser.get_cookie("vmplacer_ui") is None


def test_a_read_token_signs_in_and_every_page_renders_without_csp_violations(site, browser):
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # drop what earlier tests logged
    _sign_in(browser, site, site.read)
    assert browser.current_url == f"{site.url}/ui/"
    cookie = browser.get_cookie("vmplacer_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert browser.execute_script("return document.cookie") == ""  # out of any script's reach
    rows = browser.find_elements(By.CSS_SELECTOR, "#fleet-rows tr[data-host]")
    assert sorted(r.get_attribute("data-host") for r in rows) == sorted([EXAMPLE_HOST_NAME, BIG])
    _shot(browser, "fleet")
    for path in (f"/ui/hosts/{EXAMPLE_HOST_NAME}", f"/ui/hosts/{BIG}", "/ui/?sort=free_cores&order=desc",
                 "/ui/plans", "/ui/plans/1"):
        browser.get(site.url + path)
        assert browser.find_element(By.TAG_NAME, "h1").text
        assert browser.execute_script("return document.readyState") == "complete"
    _shot(browser, "plan")
    browser.get(f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    browser.execute_script("return window.vmplacerRefresh()")  # one refresh round: fetch + DOM update
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") == "1")
    _shot(browser, "host")
    violations = [m for m in _console(browser) if "Content Security Policy" in m or "Refused to" in m]
    assert violations == []


def test_the_pcpu_map_shows_each_guest_on_its_pcpus(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    boxes = {int(b.get_attribute("data-cpu")): b for b in browser.find_elements(By.CSS_SELECTOR, "#cpu-map .cpu")}
    assert len(boxes) == len(site.container.hypervisor(EXAMPLE_HOST_NAME).topology().cpus)
    for cpu, guest in site.known.exclusive.items():
        box = boxes[cpu]
        assert box.get_attribute("data-kind") == "exclusive" and "k-exclusive" in box.get_attribute("class")
        assert box.get_attribute("data-guests").split(",")[0] == guest == DEDICATED
        assert f"exclusive {DEDICATED}" in box.get_attribute("title")
    for cpu, guest in site.known.floating.items():
        assert boxes[cpu].get_attribute("data-kind") == "floating"
        assert guest == SHARED and SHARED in boxes[cpu].get_attribute("data-guests").split(",")
    cpu = next(iter(site.known.exclusive))
    boxes[cpu].click()
    assert DEDICATED in browser.find_element(By.ID, "picked").text


def test_hostile_names_and_labels_render_as_text(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    for path in (f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/", "/ui/plans/1"):
        browser.get(site.url + path)
        browser.execute_script("return window.vmplacerRefresh()")  # the DOM the script builds, too
        assert browser.find_elements(By.TAG_NAME, "img") == []
        assert _no_alert(browser)
    browser.get(f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    browser.execute_script("return window.vmplacerRefresh()")
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") == "1")
    rows = browser.find_elements(By.CSS_SELECTOR, "#guest-rows tr")
    texts = [r.text for r in rows]
    assert any(HOSTILE in t for t in texts), texts  # shown as the characters it is made of
    assert browser.find_elements(By.TAG_NAME, "img") == [] and _no_alert(browser)


def test_a_read_token_cannot_change_anything_through_the_page(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    forms = browser.find_elements(By.TAG_NAME, "form")
    assert [f.get_attribute("action") for f in forms] == [f"{site.url}/ui/logout"]
    statuses = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const tries = [["PUT", "/v1/hosts/example/maintenance", {reason: "from the page"}],
                       ["POST", "/v1/plans", {}], ["POST", "/ui/hosts/example", {}], ["DELETE", "/ui/", null]];
        Promise.all(tries.map(([method, url, body]) => fetch(url, {method, credentials: "include",
            headers: {"Content-Type": "application/json"}, body: body ? JSON.stringify(body) : undefined})
            .then((r) => r.status))).then(done, (e) => done(String(e)));
    """)
    assert statuses == [401, 401, 405, 405]
    assert site.container.maintenance.current() == {}


def test_the_csp_header_reaches_the_browser(site, browser):
    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/")
    header = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        fetch("/ui/", {credentials: "same-origin"}).then((r) => done(r.headers.get("content-security-policy")));
    """)
    assert header == CSP


def test_a_new_placement_appears_on_the_next_refresh_without_reload(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    browser.execute_script("document.body.dataset.marker = 'same page'")
    topology = site.container.hypervisor(EXAMPLE_HOST_NAME).topology()
    core = [c for c in topology.cores if c.node == topology.nodes_with_cpus()[-1]][-1]
    cpu = core.cpus[0]
    assert browser.find_element(By.CSS_SELECTOR, f'.cpu[data-cpu="{cpu}"]').get_attribute("data-kind") == "free"
    late = Placement(guest="late-1", host=EXAMPLE_HOST_NAME, vcpupin={0: frozenset({cpu})}, memory_kib=1 << 20,
                     dedicated=True, exclusive_cpus=frozenset({cpu}))
    site.container.placement_store.record(EXAMPLE_HOST_NAME, "test:///default", late, {"name": "late-1"})
    try:
        browser.execute_script("return window.vmplacerRefresh()")
        box = browser.find_element(By.CSS_SELECTOR, f'.cpu[data-cpu="{cpu}"]')
        _wait(browser, lambda d: box.get_attribute("data-guests") == "late-1")
        assert box.get_attribute("data-kind") == "exclusive"
        assert browser.execute_script("return document.body.dataset.marker") == "same page"  # no reload
    finally:
        site.container.placement_store.forget("late-1")


def test_a_host_of_512_pcpus_renders_every_pcpu(site, browser, record_property):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{BIG}")
    boxes = browser.find_elements(By.CSS_SELECTOR, "#cpu-map .cpu[data-cpu]")
    assert len(boxes) == 512
    assert len(browser.find_elements(By.CSS_SELECTOR, "#cpu-map .node")) == 4
    assert len(browser.find_elements(By.CSS_SELECTOR, "#cpu-map .package")) == 2
    timing = browser.execute_script("""
        const n = performance.getEntriesByType("navigation")[0];
        return {response: n.responseEnd - n.startTime, dom: n.domComplete - n.startTime,
                load: n.loadEventEnd - n.startTime, bytes: n.transferSize};""")
    for name, value in timing.items():
        record_property(f"big_host_{name}", round(value, 1))
    print(f"512-pCPU host page: {timing}")
    assert timing["dom"] >= timing["response"] > 0  # the browser's own ordering of its events
    _shot(browser, "host-512")


def _guest_url(site: Site, guest: str) -> str:
    from urllib.parse import quote

    return f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}/guests/{quote(guest, safe='')}"


def test_the_guest_page_shows_the_right_pins(site, browser):
    from selenium.webdriver.common.by import By

    from vmplacer.core.topology.cpuset import format_cpuset

    browser.get_log("browser")
    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    browser.execute_script("return window.vmplacerRefresh()")  # the guest table as the script rebuilds it
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") == "1")
    browser.find_element(By.LINK_TEXT, DEDICATED).click()  # from the host page's guest table
    _wait(browser, lambda d: d.current_url == _guest_url(site, DEDICATED))
    assert browser.find_element(By.ID, "guest-name").text == DEDICATED
    owned = list(site.known.exclusive)  # vCPU i on the i-th pCPU it was given
    pins = [(r.get_attribute("data-vcpu"), r.find_elements(By.TAG_NAME, "td")[1].text)
            for r in browser.find_elements(By.CSS_SELECTOR, "#vcpupin tbody tr")]
    assert pins == [(str(i), str(cpu)) for i, cpu in enumerate(owned)]
    assert browser.find_element(By.ID, "emulatorpin").text == format_cpuset(frozenset(site.known.emulator))
    assert browser.find_element(By.ID, "exclusive").text == format_cpuset(frozenset(owned))
    assert browser.find_element(By.ID, "memory-nodes").text == "0 (strict)"
    neighbours = {r.get_attribute("data-neighbour"): r.text
                  for r in browser.find_elements(By.CSS_SELECTOR, "#neighbours tr[data-neighbour]")}
    assert set(neighbours) == {SHARED, HOSTILE}  # the hostile name as the characters it is made of
    assert all(" %" in text for text in neighbours.values())
    assert len(browser.find_elements(By.CSS_SELECTOR, "#history tr[data-run]")) == 2
    assert browser.find_elements(By.TAG_NAME, "img") == [] and _no_alert(browser)
    _shot(browser, "guest")
    browser.get(f"{site.url}/ui/plans/1")
    browser.find_element(By.LINK_TEXT, SHARED).click()  # from the plan page, to where it runs now
    _wait(browser, lambda d: d.current_url == _guest_url(site, SHARED))
    assert [r.get_attribute("data-plan") for r in browser.find_elements(By.CSS_SELECTOR, "#guest-plans tr")[1:]] == ["1"]
    browser.get(_guest_url(site, HOSTILE))
    assert browser.find_element(By.ID, "guest-name").text == HOSTILE
    assert browser.find_elements(By.TAG_NAME, "img") == [] and _no_alert(browser)
    violations = [m for m in _console(browser) if "Content Security Policy" in m or "Refused to" in m]
    assert violations == []


def test_the_model_page_draws_heat_map_cells_with_their_counts(site, browser):
    from selenium.webdriver.common.by import By

    from vmplacer.core.topology.host import NEIGHBOUR_CLASSES

    browser.get_log("browser")
    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/model")
    maps = browser.find_elements(By.CSS_SELECTOR, "section.heatmap")
    assert [m.get_attribute("data-distance") for m in maps] == [c.value for c in NEIGHBOUR_CLASSES]
    model = site.container.load_model()
    keys = model.known_keys()
    observed = {(c.value, u, v): n for (c, u, v), n in model.pair_evidence().items() if n > 0}
    cells = browser.find_elements(By.CSS_SELECTOR, "td.cell[data-beta]")
    assert len(cells) == len(maps) * len(keys) * (len(keys) - 1)
    seen = 0
    for section in maps:
        distance = section.get_attribute("data-distance")
        for cell in section.find_elements(By.CSS_SELECTOR, "td.cell[data-beta]"):
            key = (distance, cell.get_attribute("data-background"), cell.get_attribute("data-foreground"))
            count = float(cell.find_element(By.CLASS_NAME, "obs").text)
            assert count == pytest.approx(observed.get(key, 0.0), rel=1e-2)
            assert (count > 0) == ("prior" not in cell.get_attribute("class").split())
            # drawn: a colour class from the stylesheet, not an inline style
            assert cell.get_attribute("style") in (None, "")
            assert cell.value_of_css_property("background-color") != "rgba(0, 0, 0, 0)"
            seen += count > 0
    assert seen == len(observed) > 0
    assert browser.find_elements(By.TAG_NAME, "img") == [] and _no_alert(browser)
    _shot(browser, "model")
    violations = [m for m in _console(browser) if "Content Security Policy" in m or "Refused to" in m]
    assert violations == []


def test_an_unknown_page_is_a_page(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/nowhere")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Not found"
