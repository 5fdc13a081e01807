"""The engine's build: patches against llama-cpp-python, ``builder`` (sdist, patched tree,
cached wheel, CMake builds) and ``backends`` (which backend, its CMake flags). Not part of
the product: ``make engine`` and ``bench/`` import it; the app never does."""
