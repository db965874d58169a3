"""The needle corpus of the shipped chain's stage 6; the code lives in the library,
``focus_lab.train.needle_corpus`` (this name keeps the committed commands working)::

    python -m analyses.studies.needle_corpus --out data/needle_mix --docs 64
"""

from focus_lab.train.needle_corpus import main

if __name__ == "__main__":
    raise SystemExit(main())
