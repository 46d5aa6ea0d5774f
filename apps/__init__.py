"""The Hyper-SET web app (Gradio 6): a streaming Sudoku solver and masked image reconstruction.

Start it with ``hyperset-app`` (see ``hyperset.apps.cli``); build it in Python with ``hyperset.apps.app.build_demo``.
"""

import os

# Gradio reports usage to its servers unless told not to: a local demo does not, unless the user asks for it by
# setting GRADIO_ANALYTICS_ENABLED=True themselves. Set before any module of this package imports gradio.
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
