"""The Streamlit dashboard (``focus-lab app``), installed as ``focus_lab.app`` from the
repository's ``app/`` folder (pyproject ``package-dir``). ``main.py`` and ``app_pages/*.py`` are
run as scripts by Streamlit; ``lib`` is the module they share (imported, never run)."""
