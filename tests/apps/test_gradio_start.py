"""hyperset.apps.gradio_start: Gradio imported without its stub rewriting and with pandas on first use, the same
Gradio otherwise. Each case runs in a fresh interpreter (the hooks only act on a first import of Gradio)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("gradio")


def _run(code: str, cwd: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


COMPONENT = """
import gradio as gr


class Box(gr.Textbox):
    pass
"""


@pytest.mark.slow
@pytest.mark.parametrize("hooked", [True, False])
def test_a_component_class_writes_no_stub_beside_its_source(tmp_path, hooked):
    """Plain Gradio writes `box.pyi` beside a file that defines a component class (its development aid); through
    import_gradio() nothing is written, and the class is a working component."""
    (tmp_path / "box.py").write_text(COMPONENT)
    first = "from hyperset.apps.gradio_start import import_gradio; import_gradio()" if hooked else "import gradio"
    out = _run(f"""
        {first}
        import json, box
        b = box.Box("x", label="l")
        print(json.dumps({{"value": b.value, "events": [e.event_name for e in box.Box.EVENTS][:3]}}))
        """, tmp_path)
    assert out["value"] == "x" and out["events"]
    assert (tmp_path / "box.pyi").exists() is not hooked


@pytest.mark.slow
def test_pandas_is_imported_when_gradio_caching_first_uses_it(tmp_path):
    out = _run("""
        import json, sys
        from hyperset.apps.gradio_start import import_gradio
        gr = import_gradio()
        before = "pandas" in sys.modules
        import gradio.caching as caching
        is_frame = caching.pd.DataFrame  # the first attribute read imports the real pandas
        import pandas
        import pandas.io.formats.style  # a submodule import after it: the one real package
        print(json.dumps({"before": before, "same": is_frame is pandas.DataFrame,
                          "real": type(sys.modules["pandas"]) is type(json),
                          "styler": hasattr(pandas.io.formats.style, "Styler")}))
        """, tmp_path)
    assert out == {"before": False, "same": True, "real": True, "styler": True}


@pytest.mark.slow
def test_pandas_imported_before_gradio_is_left_alone(tmp_path):
    out = _run("""
        import json, sys
        import pandas
        from hyperset.apps.gradio_start import import_gradio
        import_gradio()
        import gradio.caching as caching
        print(json.dumps({"same": caching.pd is pandas}))
        """, tmp_path)
    assert out == {"same": True}


@pytest.mark.slow
def test_the_app_builds_and_answers_through_the_hooked_import(tmp_path):
    """The shipped models' app, built after import_gradio(), answers /solve as the app does."""
    out = _run("""
        import json
        from hyperset.apps.gradio_start import import_gradio
        import_gradio()
        from hyperset.apps.cli import load_models, options
        from hyperset.apps.app import HyperSETApp
        app = HyperSETApp(*load_models(options(["--threads", "1"])))
        demo = app.build()
        board, verdict, energies = app.sudoku.api_solve(
            "000014200500070300000590004058400001000000006003080090870060000420805017009047000", 48, "search")
        print(json.dumps({"verdict": verdict, "board": board, "passes": energies["passes"]}))
        """, Path(__file__).resolve().parents[2])
    assert out["verdict"] == "solved" and len(out["board"]) == 81 and out["passes"] >= 1


def test_a_module_that_reads_pandas_while_it_runs_gets_the_real_one(tmp_path):
    """The stand-in is only bound, never a second pandas: a read during gradio.caching's own run imports pandas."""
    out = _run("""
        import json, sys, types
        from hyperset.apps import gradio_start
        caching = types.ModuleType("gradio.caching")

        class Loader:
            def exec_module(self, module):
                import pandas as pd
                module.frame = pd.DataFrame  # an attribute read at import time
                module.pd = pd

        gradio_start._exec_with_pandas_on_use(Loader(), caching)
        import pandas
        print(json.dumps({"same": caching.frame is pandas.DataFrame,
                          "real": sys.modules["pandas"] is pandas and type(pandas) is type(json)}))
        """, tmp_path)
    assert out == {"same": True, "real": True}


@pytest.mark.slow
def test_a_blocks_built_without_interim_apps_serves_after_launch(tmp_path: Path) -> None:
    """`no_interim_apps`: no FastAPI app is made when the Blocks closes or queues; launch() makes the one it serves,
    and the page answers."""
    result = _run("""
        import json, urllib.request
        from hyperset.apps.gradio_start import import_gradio, no_interim_apps
        import_gradio()
        import gradio as gr
        from gradio.routes import App
        made = []
        real = App.create_app
        App.create_app = staticmethod(lambda *a, **k: made.append(1) or real(*a, **k))
        with no_interim_apps():
            with gr.Blocks() as demo:
                box = gr.Textbox()
                gr.Button().click(lambda s: s, box, box)
            demo.queue()
        interim = demo.app is None and not made
        demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
        status = urllib.request.urlopen(demo.local_url).status
        demo.close()
        print(json.dumps({"interim": interim, "made": len(made), "status": status}))
    """, tmp_path)
    assert result == {"interim": True, "made": 1, "status": 200}
