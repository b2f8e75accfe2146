"""The gradio demo (app.py): ``cli`` parses and checks its command line before torch or gradio is
imported; ``page`` serves one checkpoint and shows the images forming while they are decoded."""
