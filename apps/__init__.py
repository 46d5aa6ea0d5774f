"""The Hyper-SET web app (Gradio 6): a streaming Sudoku solver and masked image reconstruction.

Start it with ``hyperset-app`` (see ``hyperset.apps.cli``); build it in Python with ``hyperset.apps.app.build_demo``.
"""
