"""The demo page (app.py, mutor2d/demo/page.py): settings from the URL and their one-line errors, the images
forming (TokenWatch), the grid equal to sample.py's; in a real browser (headless Debian chromium driven
by selenium, nothing downloaded) every decoding mode, the statistics and the shared link; concurrent
requests queued. The docs' screenshot:

    python tests/test_demo.py runs/digits_mutor2d docs/demo.png
"""
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qsl

import pytest
import torch

from conftest import demo_extra
from timeouts import limit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
demo_extra("gradio")
from test_hub import tiny_run  # noqa: E402

from mutor2d.sampling import images as generation  # noqa: E402
from mutor2d.demo import cli as demo_cli, page as demo_lib  # noqa: E402
from mutor2d.sampling.rules import SamplingRules  # noqa: E402
from mutor2d.sampling.decoding import decoding_mode, run_decoder  # noqa: E402
from mutor2d.sampling.auto import CROSSOVER, auto_decode  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("demo") / "run")


@pytest.fixture(scope="module")
def src(run):
    return generation.open_checkpoint(run / "checkpoints" / "step_00000002.pt", device="cpu")


def test_settings_from_the_url_and_their_errors(src):
    d = demo_lib.Demo(src, torch.device("cpu"), "RUN")
    st = demo_lib.settings_from_query({"classes": "1,7", "cfg": "3", "decode": "jacobi", "other": "x"}, d.defaults())
    assert st["classes"] == [1, 7] and st["cfg"] == 3.0 and st["decode"] == "jacobi" and st["per_class"] == 4
    assert demo_lib.settings_from_query(dict(parse_qsl(demo_lib.query_string(st))), d.defaults()) == st
    with pytest.raises(ValueError, match="^seed='x': expected an integer$"):
        demo_lib.settings_from_query({"seed": "x"}, d.defaults())
    for bad, message in [({"classes": [12]}, "class 12 is out of range 0..9"),
                         ({"decode": "registers", "draft": 5}, "^draft tokens=5: this checkpoint's registers"),
                         ({"per_class": 40}, "images per class 40: expected 1..32"),
                         ({"top_p": 0.0}, "^top-p: expected a number in"), ({"decode": "beam"}, "decode='beam'")]:
        with pytest.raises(ValueError, match=message):
            demo_lib.sample_config(src, {**d.defaults(), "classes": [1, 7], **bad}, "cpu")
    assert demo_lib.choice_labels(src) == [(str(i), i) for i in range(10)] and demo_lib.choices_name(src) == "classes"
    imagenet = SimpleNamespace(kind=src.kind, cfg=SimpleNamespace(model=SimpleNamespace(num_classes=1000)),
                               num_choices=1000)
    labels = demo_lib.choice_labels(imagenet)
    assert len(labels) == 1000 and labels[0] == ("0: tench", 0) and labels[207] == ("207: golden retriever", 207)


@pytest.mark.parametrize("mode", ["plain", "registers", "jacobi"])
def test_token_watch_sees_the_tokens_as_they_are_emitted(src, mode):
    """Every token the watch reports equals the decoder's, and all but the last round's are seen; the
    model's decode method is left alone (the watch is the decoder's progress callback)."""
    B, N, K = 3, 64, 1
    watch = demo_lib.TokenWatch(B, N)
    out = run_decoder(src.model, torch.tensor([1, 4, 7]), src.grid, SamplingRules.of(2.0),
                      decoding_mode(mode, src.cfg.objective, src.grid, **({"window": K} if mode == "jacobi" else {})),
                      src.cfg.objective, torch.Generator().manual_seed(0), progress=watch)
    assert "decode" not in vars(src.model)                       # the model's own method
    tokens, known = watch.snapshot()
    assert torch.equal(tokens[known], out[known]) and bool(known[:, :N - K - 1].all())


def test_the_grid_equals_sample_py(src, run, tmp_path):
    d = demo_lib.Demo(src, torch.device("cpu"), str(run))
    st = {**d.defaults(), "classes": [2, 5], "per_class": 2, "decode": "registers", "seed": 3}
    *_, (path, stats) = list(d.run(st))
    assert "forwards per image" in stats and "acceptance by draft distance" in stats
    spec = importlib.util.spec_from_file_location("sample_cli", ROOT / "sample.py")
    sample_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample_py)
    command = stats.split("`")[1].split()
    sample_py.main([*command[2:], "--device", "cpu", "--out", str(tmp_path / "cli.png")])
    assert Path(path).read_bytes() == (tmp_path / "cli.png").read_bytes()


def test_auto_picks_the_measured_fastest(run, tmp_path, capsys):
    table = {"devices": {"cpu": [{"images": 1, "fastest": "registers", "fastest_without_registers": "jacobi"},
                                 {"images": 50, "fastest": "plain", "fastest_without_registers": "plain"}]}}
    assert [auto_decode(n, "cpu", True, table) for n in (1, 6, 8, 50, 500)] == ["registers"] * 2 + ["plain"] * 3
    assert auto_decode(1, "cpu", False, table) == "jacobi" and auto_decode(1, "cuda:0", True, table) == "plain"
    shipped = json.loads(CROSSOVER.read_text())
    for device, rows in shipped["devices"].items():
        assert shipped["measured"][device]["command"].startswith("python bench/sample.py")
        assert all(auto_decode(r["images"], device, False) in ("plain", "jacobi") for r in rows)
        assert all(auto_decode(r["images"], device, True) == min(r["time_s"], key=r["time_s"].get) for r in rows)
    assert "gpu" in shipped["measured"]["cuda"]["machine"]                 # measured on a GPU, not assumed
    spec = importlib.util.spec_from_file_location("sample_cli", ROOT / "sample.py")
    sample_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample_py)
    sample_py.main(["--ckpt", str(run), "--classes", "1", "--per-class", "1", "--decode", "auto", "--device", "cpu",
                    "--out", str(tmp_path / "auto.png")])
    assert f"--decode auto: {auto_decode(1, 'cpu', True)} (batches of 1 images on cpu)" in capsys.readouterr().out
    sample_py.main(["--ckpt", str(run), "--num", "20", "--npz", "--batch-size", "30", "--decode", "auto",
                    "--device", "cpu"])                 # --npz alone: its batches are of --num's images
    picked = f"--decode auto: {auto_decode(20, 'cpu', True)} (batches of 20 images on cpu)"
    assert picked in capsys.readouterr().out


def test_an_unreadable_checkpoint_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit) as e:
        demo_cli.main(["--ckpt", str(tmp_path / "bad.pt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and "bad.pt" in err[0]


# ----------------------------------------------------------------------------- the page in a browser

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """app.py on a checkpoint, in a subprocess on 127.0.0.1 and a free port; its log kept."""

    def __init__(self, ckpt, log: Path):
        self.port, self.log = free_port(), log
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--ckpt", str(ckpt), "--port",
                                      str(self.port), "--device", "cpu"], stdout=log.open("w"),
                                     stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        self.url = f"http://127.0.0.1:{self.port}/"
        deadline = time.time() + limit(90)
        while "Running on" not in log.read_text():
            if self.proc.poll() is not None or time.time() > deadline:
                self.close()
                raise RuntimeError(f"app.py did not start: {log.read_text()[-2000:]}")
            time.sleep(0.3)

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)


def skip_without_chromium():
    if not CHROMIUM or not DRIVER:
        reason = "no chromium/chromedriver installed (apt-get install -y chromium chromium-driver)"
        print(f"skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    skip_without_chromium()                # before the run and the server: nothing made for nothing
    s = Server(request.getfixturevalue("run"), tmp_path_factory.mktemp("demo") / "server.log")
    yield s
    s.close()


def browser():
    """Headless Debian chromium through its chromedriver (no download); skip when absent."""
    skip_without_chromium()
    webdriver = demo_extra("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(DRIVER))


def generate(driver, url: str, timeout: float = 60) -> str:
    """Open ``url``, press Generate, wait for the statistics (or an error) -> the stats text."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver.get(url)
    wait = WebDriverWait(driver, timeout)
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#link textarea, #link input").get_attribute("value"))
    driver.find_element(By.ID, "generate").click()
    wait.until(lambda d: any(w in d.find_element(By.ID, "stats").text
                             for w in ("forwards per image", "error:")))
    return driver.find_element(By.ID, "stats").text


def shoot(url: str, out: Path) -> None:
    """A screenshot of the page after generating at ``url`` (docs/demo.png)."""
    driver = browser()
    try:
        driver.set_window_size(1400, 1250)
        generate(driver, url, timeout=limit(300))
        driver.execute_script("window.scrollTo(0, 0)")
        time.sleep(1)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()


@pytest.mark.browser
def test_every_decoding_mode_in_a_browser(server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver = browser()
    try:
        for mode in ("plain", "registers", "jacobi"):
            stats = generate(driver, f"{server.url}?classes=1,7&per_class=1&decode={mode}&window=2&seed=5")
            assert re.search(rf"decoding\s+{mode}", stats), stats
            assert "tokens/s" in stats and "forwards per image" in stats
            if mode != "plain":
                assert "acceptance by draft distance" in stats
            img = driver.find_element(By.CSS_SELECTOR, "#grid img")
            assert img.get_attribute("src") and driver.execute_script("return arguments[0].naturalWidth", img) > 0
            WebDriverWait(driver, 10).until(lambda d: "top_p=" in d.current_url)   # the full settings' link
            assert driver.find_element(By.CSS_SELECTOR, "#download a").get_attribute("href").endswith(".png")
            assert f"decode={mode}" in driver.current_url and "classes=1%2C7" in driver.current_url
        driver.save_screenshot(str(tmp_path / "demo.png"))
        assert (tmp_path / "demo.png").stat().st_size > 10_000
        stats = generate(driver, f"{server.url}?classes=1&per_class=1&decode=registers&draft=5")
        assert "error: draft tokens=5: this checkpoint's registers draft at most 1 token" in stats
    finally:
        driver.quit()
    log = server.log.read_text()
    assert log.count("mutor2d.demo request ") == 4 and "-> error: draft tokens=5" in log


@pytest.mark.browser
def test_concurrent_requests_are_queued_and_all_complete(server):
    from gradio_client import Client
    client = Client(server.url, verbose=False)
    before = server.log.read_text().count("mutor2d.demo request ")
    jobs = [client.submit([c], 1, 2.0, 1.0, 0, 1.0, c, "auto", 0, 4, api_name="/on_generate") for c in range(4)]
    results = [job.result(timeout=limit(120)) for job in jobs]
    assert all(Path(image).is_file() and "forwards per image" in stats for image, stats, *_ in results)
    assert server.log.read_text().count("mutor2d.demo request ") == before + 4      # one log line each


if __name__ == "__main__":
    ckpt, out = sys.argv[1], Path(sys.argv[2])
    srv = Server(ckpt, Path(os.environ.get("TMPDIR", "/tmp")) / "mutor2d_demo_server.log")
    try:
        shoot(f"{srv.url}?classes=0,1,2,3,4,5,6,7,8,9&per_class=4&decode=registers&seed=0", out)
    finally:
        srv.close()
    print(f"wrote {out}")
