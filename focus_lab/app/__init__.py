"""The Streamlit dashboard (``focus-lab app``); run as scripts by Streamlit, not imported."""
