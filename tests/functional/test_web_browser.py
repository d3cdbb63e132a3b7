"""The web view in a real browser: headless Chromium, driven by Selenium, against the real
application served by uvicorn on a loopback port over a real SQLite database.

Screenshots of each page land in tests/artifacts/ (not kept in git)."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.functional.test_api_helpers import free_port, make_container
from tests.functional.web_support import (DEDICATED, HOSTILE, SHARED, Known, Mixed, big_host, empty_test_driver,
                                          record_guests, record_mixed, store_plan, store_profiles)
from tests.support import require
from vmplacer.config import EXAMPLE_CAPABILITIES, EXAMPLE_HOST_NAME
from vmplacer.core.placement.guest_placement import Placement
from vmplacer.web.security import CSP

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
BIG = "big-512"
MIXED = "mixed-112"
WIDE = "nodes-16"
WAIT_S = 30.0


@dataclass
class Site:
    url: str
    read: str
    known: Known
    container: Any
    mixed: Mixed


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
             {"name": BIG, "uri": "test:///default", "capabilities": str(big_host(directory))},
             {"name": MIXED, "uri": empty_test_driver(directory),
              "capabilities": str(big_host(directory, 2, 1, 28, 2, name="mixed"))},
             {"name": WIDE, "uri": empty_test_driver(directory),
              "capabilities": str(big_host(directory, 2, 8, 2, 2, name="wide"))}]
    container = make_container(f"sqlite:///{directory / 'vmplacer.db'}", directory, hosts)
    read = SqlTokenStore(container.sessions).create("viewer", "read")
    known = record_guests(container, EXAMPLE_HOST_NAME)
    store_plan(container, EXAMPLE_HOST_NAME)
    store_profiles(container, EXAMPLE_HOST_NAME)
    mixed = record_mixed(container, MIXED)
    app = create_app(container, ApiOptions(run_jobs=False, replay_freeze_journal=False, isolation_check_s=0))
    port = free_port()
    server, thread = _serve(app, port)
    app.state.services.check_isolation()  # what `serve` does every minute: the pages show its counts
    try:
        yield Site(f"http://127.0.0.1:{port}", read, known, container, mixed)
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
    assert browser.current_url == f"{site.url}/ui/login?next=%2Fui%2Fhosts%2F{EXAMPLE_HOST_NAME}"
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
    assert site.read not in cookie["value"]  # a sign-in's id, kept on the server; never the token
    assert browser.execute_script("return document.cookie") == ""  # out of any script's reach
    rows = browser.find_elements(By.CSS_SELECTOR, "#fleet-rows tr[data-host]")
    assert sorted(r.get_attribute("data-host") for r in rows) == sorted([EXAMPLE_HOST_NAME, BIG, MIXED, WIDE])
    _shot(browser, "fleet")
    for path in (f"/ui/hosts/{EXAMPLE_HOST_NAME}", f"/ui/hosts/{BIG}", f"/ui/hosts/{MIXED}",
                 "/ui/?sort=free_cores&order=desc",
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


def test_the_fleet_shows_the_last_plans_gain_the_same_before_and_after_a_refresh(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)

    def gain() -> tuple[str, str, str]:
        link = browser.find_element(By.CSS_SELECTOR, f'#fleet-rows tr[data-host="{EXAMPLE_HOST_NAME}"] .gain')
        return link.text, link.get_attribute("href"), link.get_attribute("title")

    served = gain()
    assert served[0] == "+0.250 guest-equivalents" and served[1] == f"{site.url}/ui/plans/1", served
    assert "guest-equivalents at full speed" in served[2]
    others = browser.find_elements(By.CSS_SELECTOR, f'#fleet-rows tr[data-host="{BIG}"] .gain')
    assert others == []  # no plan covers it: a dash, no gain
    browser.execute_script("document.body.dataset.marker = 'same page'")
    browser.execute_script("return window.vmplacerRefresh()")
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") == "1")
    assert gain() == served  # the page's script writes what the server wrote
    assert browser.execute_script("return document.body.dataset.marker") == "same page"
    browser.find_element(By.CSS_SELECTOR, f'#fleet-rows tr[data-host="{EXAMPLE_HOST_NAME}"] .gain').click()
    _wait(browser, lambda d: d.current_url == f"{site.url}/ui/plans/1")
    assert "predicted gain" in browser.find_element(By.TAG_NAME, "main").text


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
    assert [f.get_attribute("action") for f in forms] == [f"{site.url}/ui/search", f"{site.url}/ui/logout"]
    assert forms[0].get_attribute("method") == "get"  # finding a guest only reads
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


def test_sign_out_ends_the_sign_in_a_copied_cookie_carried_too(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    copied = browser.get_cookie("vmplacer_ui")
    browser.find_element(By.CSS_SELECTOR, "form.logout button").click()
    _wait(browser, lambda d: d.current_url == f"{site.url}/ui/login")
    assert browser.get_cookie("vmplacer_ui") is None
    browser.add_cookie({k: copied[k] for k in ("name", "value", "path", "httpOnly", "sameSite")})
    browser.get(f"{site.url}/ui/plans")
    assert browser.current_url == f"{site.url}/ui/login?next=%2Fui%2Fplans"


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


# ----- reading a host at a glance -------------------------------------------------------------------
def _boxes_js(driver: Any) -> dict[int, dict[str, Any]]:
    """Every pCPU box as drawn: its classes, guests, short label and computed colours."""
    found = driver.execute_script("""
        const out = {};
        for (const b of document.querySelectorAll("#cpu-map .cpu[data-cpu]")) {
          const s = getComputedStyle(b);
          out[b.dataset.cpu] = {cls: b.className, guests: b.dataset.guests, kind: b.dataset.kind,
            who: b.querySelector(".who").textContent, title: b.title, bg: s.backgroundColor,
            border: s.borderTopColor, width: b.getBoundingClientRect().width, tab: b.getAttribute("tabindex")};
        }
        return out;""")
    return {int(cpu): box for cpu, box in found.items()}


def test_each_guest_of_a_112_pcpu_host_has_its_own_colour_and_name(site, browser):
    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{MIXED}")
    boxes = _boxes_js(browser)
    assert len(boxes) == 112
    colour = {}
    for guest, cpus in site.mixed.dedicated.items():
        for cpu in cpus:
            assert boxes[cpu]["kind"] == "exclusive" and boxes[cpu]["guests"].split(",")[0] == guest
            assert boxes[cpu]["who"] == guest and guest in boxes[cpu]["title"]  # the name on the box
        assert len({boxes[cpu]["bg"] for cpu in cpus}) == 1  # one colour per guest
        colour[guest] = boxes[cpus[0]]["bg"]
    assert len(set(colour.values())) == len(colour)  # guests side by side never share a colour
    shown = {"x-batch": "x-b…ch", "x-rogue": "x-r…ue"}  # names longer than a box: head…tail
    for guest, cpus in site.mixed.floating.items():
        assert {boxes[c]["who"] for c in cpus} == {shown[guest]} and guest in boxes[cpus[0]]["title"]
        assert boxes[cpus[0]]["bg"] not in colour.values()
    assert {boxes[c]["who"] for c in site.mixed.crowded} == {"×2"}
    # the legend's swatches look like boxes of the map
    legend = browser.execute_script("""return Array.from(document.querySelectorAll("#legend .cpu"),
        (s) => getComputedStyle(s).backgroundColor);""")
    first_owned = boxes[next(iter(site.mixed.dedicated.values()))[0]]["bg"]
    first_floating = boxes[site.mixed.floating["x-batch"][0]]["bg"]
    assert legend[:3] == [first_owned, first_floating, boxes[site.mixed.crowded[0]]["bg"]]
    swatches = browser.execute_script("""const out = {};
        for (const r of document.querySelectorAll("#guest-rows tr[data-guest]")) {
          out[r.dataset.guest] = getComputedStyle(r.querySelector(".swatch")).backgroundColor;
        }
        return out;""")
    assert all(swatches[g] == c for g, c in colour.items())  # the table's swatch is the boxes' colour
    _shot(browser, "host-112")


def test_pointing_at_a_guest_lights_its_pcpus_and_pointing_at_a_pcpu_lights_its_guest(site, browser):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{MIXED}")

    def lit() -> tuple[set[int], set[str]]:
        cpus = {int(b.get_attribute("data-cpu")) for b in browser.find_elements(By.CSS_SELECTOR, "#cpu-map .cpu.lit")}
        rows = {r.get_attribute("data-guest") for r in browser.find_elements(By.CSS_SELECTOR, "#guest-rows tr.lit")}
        return cpus, rows

    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-guest="x-web3"]')
    ActionChains(browser).move_to_element(row).perform()
    assert lit() == (set(site.mixed.dedicated["x-web3"]) | {site.mixed.emulator}, {"x-web3"})  # emulator too
    assert "lighting" in browser.find_element(By.ID, "cpu-map").get_attribute("class").split()
    ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()
    assert lit() == (set(), set())
    browser.execute_script("document.querySelector('tr[data-guest=\"x-batch\"] a').focus()")
    assert lit() == (set(site.mixed.floating["x-batch"]), {"x-batch"})
    cpu = site.mixed.dedicated["x-web1"][0]
    ActionChains(browser).move_to_element(browser.find_element(By.CSS_SELECTOR, f'.cpu[data-cpu="{cpu}"]')).perform()
    cpus, rows = lit()
    assert rows == {"x-web1"} and set(site.mixed.dedicated["x-web1"]) <= cpus
    # refreshing keeps what is lit
    browser.execute_script("return window.vmplacerRefresh()")
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") == "1")
    assert lit()[1] == {"x-web1"}


def test_violations_are_drawn_listed_and_turn_the_badge_to_a_warning(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    for refreshed in (False, True):  # as served, then as the live refresh redraws it
        browser.get(f"{site.url}/ui/hosts/{MIXED}")
        if refreshed:
            browser.execute_script("return window.vmplacerRefresh()")
            _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") == "1")
        boxes = _boxes_js(browser)
        violated = {cpu for cpu, box in boxes.items() if "violated" in box["cls"].split()}
        assert violated == set(site.mixed.violated)
        assert all(boxes[c]["border"] == "rgb(207, 34, 46)" and site.mixed.rogue in boxes[c]["title"]
                   for c in violated)
        items = browser.find_elements(By.CSS_SELECTOR, "#violation-items li")
        assert [i.get_attribute("data-guest") for i in items] == [site.mixed.rogue]
        assert "x-web2" in items[0].text and browser.find_element(By.ID, "violation-list").is_displayed()
        badge = browser.find_element(By.ID, "host-state")
        assert "s-warning" in badge.get_attribute("class") and badge.text == "1 violation(s)"
    browser.get(f"{site.url}/ui/?q=mixed")
    state = browser.find_element(By.CSS_SELECTOR, f'tr[data-host="{MIXED}"] .state')
    assert state.text == "violations" and "s-warning" in state.get_attribute("class")


def test_a_failed_refresh_shows_a_stale_data_banner_until_one_succeeds(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{MIXED}")
    banner = browser.find_element(By.ID, "stale")
    assert not banner.is_displayed()
    browser.execute_cdp_cmd("Network.enable", {})
    offline = {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1}
    browser.execute_cdp_cmd("Network.emulateNetworkConditions", offline)
    try:
        browser.execute_script("return window.vmplacerRefresh()")
        _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-stale") == "1")
        assert banner.is_displayed() and "cannot be reached" in banner.text
        assert re.search(r"from \d\d:\d\d:\d\d UTC", banner.text), banner.text
    finally:
        browser.execute_cdp_cmd("Network.emulateNetworkConditions", {**offline, "offline": False})
    browser.execute_script("return window.vmplacerRefresh()")
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-refreshes") == "1")
    assert not banner.is_displayed() and browser.find_element(By.TAG_NAME, "body").get_attribute("data-stale") is None
    assert re.fullmatch(r"refreshed \d\d:\d\d:\d\d UTC", browser.find_element(By.ID, "refreshed").text)


def test_the_map_is_one_tab_stop_with_a_visible_ring_and_clicks_do_not_reflow(site, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{BIG}")
    before = _boxes_js(browser)
    assert [cpu for cpu, box in before.items() if box["tab"] == "0"] == [0]  # ~520 Tab presses before
    first = browser.find_element(By.CSS_SELECTOR, '.cpu[data-cpu="0"]')
    browser.execute_script("arguments[0].focus()", first)
    first.send_keys(Keys.ARROW_RIGHT)
    focused = browser.switch_to.active_element
    assert focused.get_attribute("data-cpu") != "0" and focused.get_attribute("tabindex") == "0"
    assert first.get_attribute("tabindex") == "-1"
    ring = browser.execute_script("const s = getComputedStyle(document.activeElement);"
                                  "return [s.outlineStyle, s.outlineWidth];")
    assert ring[0] != "none" and float(ring[1].rstrip("px")) >= 2
    # a click far down the 512-pCPU map: the box keeps its size, the panel is on screen
    far = browser.find_element(By.CSS_SELECTOR, '.cpu[data-cpu="511"]')
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", far)
    far.click()
    after = _boxes_js(browser)
    assert after[511]["width"] == before[511]["width"]
    assert {c: b["width"] for c, b in after.items()} == {c: b["width"] for c, b in before.items()}
    panel = browser.execute_script("const r = document.getElementById('picked').getBoundingClientRect();"
                                   "return [r.top, r.bottom, window.innerHeight];")
    assert 0 <= panel[0] and panel[1] <= panel[2], panel
    assert "pCPU 511" in browser.find_element(By.ID, "picked").text
    assert browser.find_elements(By.CSS_SELECTOR, "#node-summary tr[data-node]")  # the per-node summary


def test_no_page_scrolls_sideways_at_1366_px_or_on_a_phone(site, browser):
    _sign_in(browser, site, site.read)
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 1366, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    browser.get(f"{site.url}/ui/")  # a host of 16 NUMA nodes among them: every column on screen
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 1366
    right = browser.execute_script("""return Math.max(...Array.from(document.querySelectorAll("#fleet th"),
        (th) => th.getBoundingClientRect().right));""")
    assert right <= 1366, right
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    try:
        widths = {}
        for path in ("/ui/", f"/ui/hosts/{MIXED}", f"/ui/hosts/{EXAMPLE_HOST_NAME}", "/ui/plans", "/ui/plans/1",
                     f"/ui/hosts/{EXAMPLE_HOST_NAME}/guests/{DEDICATED}", "/ui/model"):
            browser.get(site.url + path)
            widths[path] = browser.execute_script(
                "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];")
        assert all(scroll <= client for scroll, client in widths.values()), widths
        assert {client for _, client in widths.values()} == {390}
        browser.get(f"{site.url}/ui/hosts/{MIXED}")
        _shot_phone(browser, "host-112-phone")
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def _shot_phone(driver: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"web-{name}.png"))


# ----- finding a guest, and returning after a sign-in -----------------------------------------------
def _submit_token(driver: Any, token: str) -> None:
    """Types the token into the login page on screen and sends the form (whatever `next` it carries)."""
    from selenium.webdriver.common.by import By

    field = driver.find_element(By.ID, "token")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.ID, "sign-in").click()


def test_the_header_search_finds_guests_and_links_to_their_pages(site, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{MIXED}")
    box = browser.find_element(By.ID, "search-q")
    box.send_keys("X-WEB", Keys.ENTER)  # a plain GET form: no script involved
    _wait(browser, lambda d: d.current_url == f"{site.url}/ui/search?q=X-WEB")
    rows = browser.find_elements(By.CSS_SELECTOR, "#search-results tr[data-guest]")
    assert [r.get_attribute("data-guest") for r in rows] == sorted(site.mixed.dedicated)
    assert {r.get_attribute("data-host") for r in rows} == {MIXED}
    assert f"{len(rows)} guest(s) whose name holds" in browser.find_element(By.ID, "search-count").text
    assert browser.find_element(By.ID, "search-q").get_attribute("value") == "X-WEB"
    rows[0].find_element(By.CSS_SELECTOR, "a.host").click()
    _wait(browser, lambda d: d.current_url == f"{site.url}/ui/hosts/{MIXED}")
    browser.back()
    first = sorted(site.mixed.dedicated)[0]
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results a.guest"))
    browser.find_element(By.CSS_SELECTOR, "#search-results a.guest").click()
    _wait(browser, lambda d: d.find_elements(By.ID, "guest-name"))
    assert browser.find_element(By.ID, "guest-name").text == first
    # hostile input: found as text, nothing runs
    box = browser.find_element(By.ID, "search-q")
    box.clear()
    box.send_keys("<img src=x", Keys.ENTER)
    _wait(browser, lambda d: "/ui/search?q=" in d.current_url)
    rows = browser.find_elements(By.CSS_SELECTOR, "#search-results tr[data-guest]")
    assert [r.get_attribute("data-guest") for r in rows] == [HOSTILE]
    assert HOSTILE in rows[0].text and browser.find_elements(By.TAG_NAME, "img") == [] and _no_alert(browser)
    browser.get(f"{site.url}/ui/search?q=")  # an empty query: a page saying so, not an error
    assert "type part of a guest's name" in browser.find_element(By.ID, "search-problem").text


def test_signing_in_returns_to_the_page_that_asked_and_never_elsewhere(site, browser):
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(f"{site.url}/ui/plans/1")
    assert browser.current_url == f"{site.url}/ui/login?next=%2Fui%2Fplans%2F1"
    _submit_token(browser, site.read)
    _wait(browser, lambda d: d.current_url == f"{site.url}/ui/plans/1")
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("Plan #1")
    # signed out under an open page: its next refresh sends it to sign in, then back to it
    browser.get(f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    browser.delete_all_cookies()
    browser.execute_script("window.vmplacerRefresh()")
    _wait(browser, lambda d: d.current_url.startswith(f"{site.url}/ui/login"))
    assert browser.current_url == f"{site.url}/ui/login?next=%2Fui%2Fhosts%2F{EXAMPLE_HOST_NAME}"
    _submit_token(browser, site.read)
    _wait(browser, lambda d: d.current_url == f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    # a crafted login link to another site signs in to the fleet instead
    for crafted in ("https://evil.example/", "//evil.example/ui/", "/ui/%2F..%2F..%2Fv1", "/\\evil.example"):
        from urllib.parse import quote

        browser.delete_all_cookies()
        browser.get(f"{site.url}/ui/login?next={quote(crafted, safe='')}")
        _submit_token(browser, site.read)
        _wait(browser, lambda d: d.current_url == f"{site.url}/ui/")


def test_the_memory_table_lists_hugepage_pools_and_follows_a_new_placement(site, browser):
    from selenium.webdriver.common.by import By

    _sign_in(browser, site, site.read)
    browser.get(f"{site.url}/ui/hosts/{EXAMPLE_HOST_NAME}")
    topology = site.container.hypervisor(EXAMPLE_HOST_NAME).topology()
    node = topology.nodes_with_cpus()[-1]
    pool = topology.nodes[node].hugepage_pool(2048)
    assert pool is not None and pool.total  # the example host has 2 MiB pages on every node

    def placeable() -> int:
        span = browser.find_element(By.CSS_SELECTOR, f'#memory-rows tr[data-node="{node}"] .pool[data-size-kib="2048"]')
        return int(span.get_attribute("data-placeable"))

    before = placeable()
    assert "excludes the hugepage pools" in browser.find_element(By.ID, "memory-note").text
    cpu = max(topology.cpus_in_node(node))
    huge = Placement(guest="huge-late", host=EXAMPLE_HOST_NAME, vcpupin={0: frozenset({cpu})}, memory_kib=1 << 20,
                     memory_nodes=frozenset({node}), hugepage_kib=2048)
    site.container.placement_store.record(EXAMPLE_HOST_NAME, "test:///default", huge, {"name": "huge-late"})
    try:
        browser.execute_script("document.body.dataset.marker = 'same page'")
        browser.execute_script("return window.vmplacerRefresh()")
        # a refresh round per poll until the server's record cache has the new placement
        _wait(browser, lambda d: placeable() != before or d.execute_script("return window.vmplacerRefresh()"))
        assert placeable() == before - (1 << 20) // 2048  # 512 pages of 2 MiB taken, shown without a reload
        assert browser.execute_script("return document.body.dataset.marker") == "same page"
    finally:
        site.container.placement_store.forget("huge-late")
