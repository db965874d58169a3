"""The dashboard's pages, run as scripts by Streamlit's ``st.navigation`` (``app/main.py``)."""
