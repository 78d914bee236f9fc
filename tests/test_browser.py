"""The notebook face in a real browser (Debian's chromium driven by playwright): the chat widget running in JupyterLab
over the bundled model, and the rendered documentation site. These tests fail — they never skip — when chromium is
missing: `.ci/run` installs it."""
import json, os, re, shutil, socket, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "tests" / "screenshots"
CHROMIUM = os.environ.get("LITELLAMA_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def _wait_http(url, proc, timeout=120):
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None: raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200: return
        except OSError: pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout} s")


def _stop(proc):
    proc.terminate()
    try: proc.wait(20)
    except subprocess.TimeoutExpired: proc.kill(); proc.wait()


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), f"chromium not found at {CHROMIUM}: apt-get install -y chromium (.ci/run does it)"
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


# ---------------------------------------------------------------- the chat widget in JupyterLab

CHAT_NB = {"cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {}, "outputs": [],
                      "source": "from litellama.entrypoints.widget import ChatWidget\nchat = ChatWidget()\nchat"}],
           "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
           "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture(scope="module")
def jupyterlab():
    d = Path(tempfile.mkdtemp(prefix="litellama-lab-"))
    (d / "chat.ipynb").write_text(json.dumps(CHAT_NB))
    settings = d / ".settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(d / ".settings"), "JUPYTERLAB_WORKSPACES_DIR": str(d / ".ws"),
           "JUPYTER_CONFIG_DIR": str(d / ".jupyter"), "JUPYTER_RUNTIME_DIR": str(d / ".runtime")}
    port = _free_port()
    log = open(d / "lab.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", "--ip=127.0.0.1", f"--port={port}",
                             "--ServerApp.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
                             f"--ServerApp.root_dir={d}", "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
                            cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        try: _wait_http(f"http://127.0.0.1:{port}/api/status", proc)
        except RuntimeError as e: raise RuntimeError(f"{e}; JupyterLab log:\n{(d / 'lab.log').read_text()[-3000:]}") from None
        yield f"http://127.0.0.1:{port}", d
    finally:
        _stop(proc); log.close()
        shutil.rmtree(d, ignore_errors=True)


def _assistant_texts(page): return page.locator(".litellama-chat .ll-assistant").all_inner_texts()


def _watch_last_reply(page, until, timeout=180):
    "Poll the last assistant bubble until `until(text)`; returns every distinct state seen on the way."
    states, t = [], time.time()
    while time.time() - t < timeout:
        texts = _assistant_texts(page)
        if texts and (not states or states[-1] != texts[-1]): states.append(texts[-1])
        if texts and until(texts[-1]): return states
        time.sleep(0.05)
    raise AssertionError(f"timed out; last states: {states[-3:]}")


def test_chat_widget_in_jupyterlab(browser, jupyterlab):
    url, d = jupyterlab
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    page.goto(f"{url}/lab/tree/chat.ipynb")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)   # the kernel is up and connected
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
    page.keyboard.press("Shift+Enter")
    try: page.wait_for_selector(".jp-Cell .jp-InputPrompt:has-text('[*]'), .jp-Cell .jp-InputPrompt:has-text('[1]')", timeout=20_000)
    except Exception:                                        # the keypress came before the notebook was ready: once more
        page.locator(".jp-Notebook .jp-Cell .cm-content").first.click(); page.keyboard.press("Shift+Enter")
    chat = page.locator(".litellama-chat")
    chat.wait_for(timeout=240_000)                          # the kernel loads the bundled model first

    question = chat.locator("input[type=text]")
    question.fill("What is the capital of France?")
    question.press("Enter")
    states = _watch_last_reply(page, lambda s: "tok/s" in s)
    final = states[-1]
    streamed = [s for s in states[:-1] if s.strip() not in ("", "…")]
    assert len(streamed) >= 2, f"expected tokens to arrive one by one, saw {states}"
    assert "Paris" in final, final

    chat.locator("input[type=number]").fill("400")          # a long answer, stopped part way
    chat.locator("input[type=number]").press("Tab")
    question.fill("Write a long, detailed essay about the history of Europe, century by century.")
    question.press("Enter")
    page.wait_for_function("() => { const b = document.querySelectorAll('.litellama-chat .ll-assistant');"
                           " return b.length == 2 && b[1].innerText.length > 60; }", timeout=120_000)
    chat.get_by_role("button", name="Stop").click()
    states = _watch_last_reply(page, lambda s: "stopped" in s, timeout=60)
    n = int(re.search(r"(\d+) tokens", states[-1])[1])
    assert 0 < n < 400, states[-1]
    time.sleep(1)
    assert _assistant_texts(page)[-1] == states[-1], "text kept arriving after Stop"
    assert chat.get_by_role("button", name="Send").is_enabled()

    SHOTS.mkdir(exist_ok=True)
    chat.locator(".ll-chat").evaluate("e => e.scrollTop = 0")
    chat.screenshot(path=str(SHOTS / "chat_widget.png"))
    page.close()


# ---------------------------------------------------------------- the documentation site

@pytest.fixture(scope="module")
def site():
    "The built site: $LITELLAMA_DOCS_DIR when set (e.g. after `make docs`), else a fresh build into a temporary folder."
    if os.environ.get("LITELLAMA_DOCS_DIR"):
        d, tmp = Path(os.environ["LITELLAMA_DOCS_DIR"]), None
    else:
        from litellama.devtools.docs import build_docs
        tmp = Path(tempfile.mkdtemp(prefix="litellama-site-"))
        d = build_docs(tmp / "docs", root=ROOT)
        assert not build_docs.failed, f"cells failed while building the docs: {build_docs.failed}"
    assert (d / "index.html").exists(), f"no site in {d}"
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(d)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}/index.html", proc, 30)
        yield f"http://127.0.0.1:{port}", d
    finally:
        _stop(proc)
        if tmp: shutil.rmtree(tmp, ignore_errors=True)


def test_docs_site(browser, site):
    url, d = site
    pages = sorted(p.name for p in d.glob("*.html"))
    assert len(pages) >= 20 and "index.html" in pages
    page = browser.new_page(viewport={"width": 1100, "height": 720})
    errors = []
    page.on("console", lambda m: m.type == "error" and errors.append(f"{page.url}: {m.text}"))
    page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"{page.url}: failed {r.url}"))
    broken = []
    for name in pages:
        resp = page.goto(f"{url}/{name}", wait_until="load")
        assert resp.status == 200, name
        assert page.locator("nav.ll-sidebar a.ll-current").count() == 1, f"{name}: sidebar does not mark the page"
        for href in page.eval_on_selector_all("a[href]", "as => as.map(a => a.getAttribute('href'))"):
            if re.match(r"^[a-z]+:", href) or href.startswith("#"): continue
            path, _, frag = href.partition("#")
            if not (d / path).is_file(): broken.append(f"{name} -> {href}")
            elif frag and path == name and not page.locator(f"[id='{frag}']").count(): broken.append(f"{name} -> #{frag}")
    assert not errors, "console errors:\n" + "\n".join(errors[:20])
    assert not broken, "broken internal links:\n" + "\n".join(broken[:20])

    sidebar = page.eval_on_selector_all("nav.ll-sidebar h4", "hs => hs.map(h => h.innerText.toLowerCase())")
    order = ["models", "kv cache", "scheduler", "sampler", "kernels", "server", "benchmarks"]
    assert [s for s in sidebar if s in order] == order, sidebar

    page.goto(f"{url}/kernels-02_rmsnorm.html")
    assert page.locator("main img").count() >= 1, "the kernel page shows its benchmark plot"
    assert page.locator("main h2, main h3, main h4").filter(has_text="rms_norm").count() >= 1, "API reference from show_doc"
    SHOTS.mkdir(exist_ok=True)
    page.locator("main img").first.scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "docs_kernel.png"))
    page.goto(f"{url}/index.html")
    page.screenshot(path=str(SHOTS / "docs_home.png"))
    page.close()


# ---------------------------------------------------------------- the chat widget with an image, over a tiny LLaVA

VISION_NB = {"cells": [{"cell_type": "code", "execution_count": None, "id": "v1", "metadata": {}, "outputs": [],
                        "source": "import tempfile\nfrom litellama.entrypoints.llm import LLM\nfrom litellama.entrypoints.widget import ChatWidget\n"
                                  "from litellama.testing.vision_checkpoints import make_llava_checkpoint\n"
                                  "llm = LLM(make_llava_checkpoint('tiny-llava', tempfile.mkdtemp()), dtype='float32', device='cpu')\n"
                                  "chat = ChatWidget(llm, max_tokens=12)\nchat"}],
             "metadata": CHAT_NB["metadata"], "nbformat": 4, "nbformat_minor": 5}


def test_vision_chat_widget_uploads_and_shows_an_image(browser, jupyterlab):
    from PIL import Image
    url, d = jupyterlab
    (d / "vision.ipynb").write_text(json.dumps(VISION_NB))
    Image.new("RGB", (120, 90), (30, 140, 200)).save(d / "blue.png")
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    page.goto(f"{url}/lab/tree/vision.ipynb?reset")        # a fresh workspace: the chat test's notebook stays closed
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.click()
    page.keyboard.press("Shift+Enter")
    chat = page.locator(".litellama-chat")
    chat.wait_for(timeout=240_000)
    with page.expect_file_chooser() as fc:                                       # the upload button opens a file chooser
        chat.get_by_role("button", name="Image").click()
    fc.value.set_files(str(d / "blue.png"))
    page.wait_for_function("() => document.querySelector('.litellama-chat').innerText.includes('1 image(s) attached')", timeout=30_000)
    question = chat.locator("input[type=text]")
    question.fill("What color is this picture?")
    question.press("Enter")
    _watch_last_reply(page, lambda s: "tok/s" in s)
    img = chat.locator(".ll-user img.ll-img")
    assert img.count() == 1 and img.first.get_attribute("src").startswith("data:image/png;base64,")
    assert img.first.evaluate("e => e.naturalWidth") > 0                         # the thumbnail really renders
    SHOTS.mkdir(exist_ok=True)
    chat.screenshot(path=str(SHOTS / "vision_chat_widget.png"))
    page.close()
