"""The mutor2d demo page (pip install -e ".[demo]"):

    python app.py --ckpt runs/digits_mutor2d [--port 7860] [--host 127.0.0.1]

Choose classes, sampling settings and the decoding mode, watch the images form; the page's URL holds
the settings. The command line lives in mutor2d/demo/cli.py, the page in mutor2d/demo/page.py.
"""
if __name__ == "__main__":
    from mutor2d.preempt import exit_on_ctrl_c
    exit_on_ctrl_c()             # before the other imports: a Ctrl-C while they load is one line, exit 130
    from mutor2d.demo.cli import main
    main()
