"""The figure pipeline and the studies of focus-lab, kept out of the library: the package sits
above ``focus_lab`` (it imports ``focus_lab``; ``focus_lab`` never imports it) and has its own
command, ``focus-lab-figures`` (``python -m analyses.figures``).

The pipeline, in this folder:

* ``analyses.figures``: ``focus-lab-figures`` (``main``) and ``run_figures``: the experiment
  registry, the renderer, the README writer.
* ``analyses.common``: what the modules below share (settings, context, style, cached reads).
* ``analyses.exp_<name>``: one experiment each, ``make_data(ctx) -> DataFrame`` cached as
  ``<out>/data/<name>.parquet``.
* ``analyses.fig_*`` / ``analyses.table_*``: one figure (``make_figure(data_dir)``) or table
  (``make_table(data_dir)``) each, over those cached results.
* ``analyses.length_table`` (perplexity by context length) and ``analyses.bench_attention``
  (hard Focus against dense, timed): scripts whose tables the pipeline and the docs read, run
  as ``python -m analyses.<script>``.

``analyses.studies``: the studies behind the docs (sweeps, budgets, audits, the shipped
routers' training chain), each a script ``python -m analyses.studies.<name>`` whose result a
page of docs/ cites; the pipeline never imports them.

Run from a checkout installed with ``pip install -e .`` (a wheel installs the package too; its
outputs go under the working directory). Sources: docs/method.md §1-§6.
"""
