"""The experiments, figures, tables and benchmarks of focus-lab (issue 17 item 1), kept out of
the library: ``focus_lab`` never imports this package, except the ``focus-lab figures`` command,
which imports ``analyses.figures`` when it runs.

* ``analyses.figures``: the runner of ``focus-lab figures`` (experiment registry, renderer,
  README writer).
* ``analyses.common``: what the modules below share (settings, context, style, cached reads).
* ``analyses.exp_<name>``: one experiment each, ``make_data(ctx) -> DataFrame`` cached as
  ``<out>/data/<name>.parquet``.
* ``analyses.fig_*`` / ``analyses.table_*``: one figure (``make_figure(data_dir)``) or table
  (``make_table(data_dir)``) each, over those cached results.
* scripts (``bench_attention``, ``length_table``, ``recipes_sweep``, ...): run as
  ``python analyses/<script>.py`` or ``python -m analyses.<script>`` from a checkout installed
  with ``pip install -e .``.

Sources: docs/method.md §1-§6.
"""
