"""The shipped router file's chain, from scratch; the code lives in the library,
``focus_lab.train.chain`` (``focus-lab routers build``; this name keeps the committed commands
working)::

    python -m analyses.studies.train_shipped --out checkpoints/shipped_chain
"""

from focus_lab.train.chain import main

if __name__ == "__main__":
    raise SystemExit(main())
