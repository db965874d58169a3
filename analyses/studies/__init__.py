"""The studies behind the docs: sweeps, budgets, audits and the shipped routers' training chain.

Each is a script (``python -m analyses.studies.<name>``) whose result a page of docs/ cites; the
figure pipeline (``analyses.figures``) never imports them. Source: docs/method.md, docs/recipes.md.
"""
