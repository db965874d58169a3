"""focus-lab dashboard: `focus-lab app --runs runs/` (bound to 127.0.0.1), or
`python -m streamlit run <this file> -- --runs <folder>`.

The dashboard is the package ``focus_lab.app`` (the folder ``app/`` of the repository, installed
with focus_lab), so this script and the pages in ``app_pages/`` import ``focus_lab.app.lib`` like
any installed module. The sidebar picks a run below the runs root; the pages read it through lib.
The Passkey and Retrieval pages pick their own folders (``focus-lab probe passkey`` / ``probe
retrieval`` outputs, not recorder runs).
"""

from __future__ import annotations

import streamlit as st

from focus_lab.app import lib

st.set_page_config(page_title="focus-lab", page_icon=":material/center_focus_strong:", layout="wide")

st.markdown("<style>.block-container{padding-top:2.2rem;padding-bottom:2rem}"
            "h1{font-size:2.1rem !important;padding-top:0 !important}"
            '[data-testid="stAppDeployButton"]{display:none}</style>', unsafe_allow_html=True)

root = lib.parse_runs_root()
st.session_state["_runs_root"] = root
names = lib.available_runs(root)

with st.sidebar:
    st.markdown("### focus-lab")
    if not root.is_dir():
        st.error(f"The runs root `{root}` does not exist; record a run with `focus-lab record`.")
    if names:
        wanted = st.query_params.get("run")
        if "run_picker" not in st.session_state or st.session_state["run_picker"] not in names:
            if wanted is not None and wanted not in names:
                st.warning(f"Run {wanted!r} is not a run below the runs root; showing {names[0]!r}.")
            st.session_state["run_picker"] = wanted if wanted in names else lib.newest_run(root, names)
        picked = st.selectbox("Run", names, key="run_picker",
                              help=f"run directories below {root}")
        st.session_state["_run"] = picked
        if st.query_params.get("run") != picked:
            st.query_params["run"] = picked
    else:
        st.session_state["_run"] = None
        st.caption(f"No runs below `{root}`.")
    st.caption(f"runs root: `{root}`")
    addr = st.get_option("server.address")
    if addr not in ("127.0.0.1", "localhost", "::1"):
        st.warning("This dashboard listens on all network interfaces; start it with `focus-lab app` "
                   "(bound to 127.0.0.1) unless you mean to share it.")

pages = [
    st.Page("app_pages/groups.py", title="Groups", icon=":material/category:", default=True),
    st.Page("app_pages/overview.py", title="Overview", icon=":material/dashboard:"),
    st.Page("app_pages/balance.py", title="Balance", icon=":material/balance:"),
    st.Page("app_pages/coverage.py", title="Coverage", icon=":material/track_changes:"),
    st.Page("app_pages/audit.py", title="Dependency audit", icon=":material/link_off:"),
    st.Page("app_pages/compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("app_pages/passkey.py", title="Passkey", icon=":material/key:"),
    st.Page("app_pages/retrieval.py", title="Retrieval", icon=":material/manage_search:"),
    st.Page("app_pages/probe.py", title="Live probe", icon=":material/science:"),
]
st.navigation(pages).run()
