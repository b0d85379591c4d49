"""A headless Chromium for the tests of `whenctl ui`, driven through Selenium.

Reads one JSON command a line on standard input and answers each with one JSON line on standard
output, so that the test (Swift) decides what to do and what to expect:

  {"op": "get", "url": U}                      load U
  {"op": "js", "script": S, "args": [...]}     run S in the page, answer its value
  {"op": "wait_js", "script": S, "timeout": T} run S until it is truthy (every 20 ms), its value
  {"op": "click", "css": C}                    click the first element C selects
  {"op": "type", "css": C, "text": T}          clear the field C and type T into it
  {"op": "screenshot", "path": P}              save the window as a PNG
  {"op": "log"}                                the browser console's messages since the last, "LEVEL text"
  {"op": "quit"}

Each answer is {"ok": true, "value": …} or {"ok": false, "error": "…"}.
"""

import json
import os
import sys
import time

os.environ.setdefault("SE_OFFLINE", "true")  # Debian's chromium and chromedriver, nothing fetched

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402


def browser():
    options = webdriver.ChromeOptions()
    for argument in [
        "--headless=new",
        "--no-sandbox",  # the tests run as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
    ]:
        options.add_argument(argument)
    options.binary_location = os.environ.get("UI_CHROMIUM", "/usr/bin/chromium")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("UI_CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(service=service, options=options)


def main():
    driver = browser()
    driver.set_page_load_timeout(20)
    answer({"ok": True, "value": driver.capabilities.get("browserVersion")})
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        op = command["op"]
        try:
            if op == "quit":
                answer({"ok": True, "value": None})
                break
            answer({"ok": True, "value": run(driver, op, command)})
        except Exception as error:  # the test says what failed
            answer({"ok": False, "error": f"{type(error).__name__}: {error}"})
    driver.quit()


def run(driver, op, command):
    if op == "get":
        driver.get(command["url"])
        return driver.title
    if op == "new_tab":
        # A tab of its own, opened by no page: what a pasted address or a link opened in a new
        # tab gets (no sessionStorage copied, no opener).
        driver.switch_to.new_window("tab")
        driver.get(command["url"])
        return driver.title
    if op == "js":
        return driver.execute_script(command["script"], *command.get("args", []))
    if op == "wait_js":
        deadline = time.monotonic() + command.get("timeout", 10)
        while True:
            value = driver.execute_script(command["script"], *command.get("args", []))
            if value:
                # An element found is true; what the test reads is its own script's to return.
                return value if isinstance(value, (str, int, float, bool, list, dict)) else True
            if time.monotonic() > deadline:
                raise TimeoutError(f"not true within {command.get('timeout', 10)} s: {command['script']}")
            time.sleep(0.02)
    if op == "click":
        driver.find_element(By.CSS_SELECTOR, command["css"]).click()
        return None
    if op == "type":
        field = driver.find_element(By.CSS_SELECTOR, command["css"])
        field.clear()
        field.send_keys(command["text"])
        return None
    if op == "screenshot":
        os.makedirs(os.path.dirname(command["path"]), exist_ok=True)
        return driver.save_screenshot(command["path"])
    if op == "log":
        return [f"{entry.get('level')} {entry.get('message')}" for entry in driver.get_log("browser")]
    raise ValueError(f"unknown op {op}")


def answer(value):
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
